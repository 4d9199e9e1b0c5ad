"""The dispatcher: meters each model's requests topic and chooses which batch's lines go next.

Modules: ``settings`` (knobs), ``policy`` (pure ordering), ``meter`` (how many lines the topic may
take), ``lease`` (one active dispatcher per model), ``positions`` (where each batch's input was read
up to), ``reader`` (input lines from object storage), ``sent_lines`` (the pure book of lines consumed
but never answered) and ``recovery`` (acting on it), ``sender`` (the messages), ``refusals``
(lines answered with an error result instead of run), ``state`` (what is
kept in memory), ``metrics`` and ``loop`` (the task the api lifespan starts). See docs/dispatcher.md.
"""
