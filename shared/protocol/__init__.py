"""Wire models: the OpenAI objects the api returns and the Kafka messages services exchange."""
