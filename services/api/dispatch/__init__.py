"""The dispatcher: meters each model's requests topic and chooses which batch's lines go next.

Modules: ``settings`` (knobs), ``policy`` (pure ordering), ``meter`` (how many lines the topic may
take), ``reader`` (input lines from object storage), ``sent_lines`` (the pure book of lines consumed
but never answered) and ``recovery`` (acting on it), ``sender`` (the messages), ``refusals``
(lines answered with an error result instead of run), ``state`` (what is
kept in memory), ``metrics`` and ``loop`` (the task the api lifespan starts). Its stored state (its
queue, each batch's position, each model's lease) is ``shared/stores/dispatcher.py``. See
docs/dispatcher.md.
"""
