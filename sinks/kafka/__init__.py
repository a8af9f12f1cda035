"""The Kafka sink (``kafka://``) and the consumer library that rebuilds tables from its topics, in layers (top to
bottom; the ``layers`` contract in ``pyproject.toml`` keeps them):

- :mod:`sinks.kafka.sink` (``KafkaSink``) and :mod:`sinks.kafka.consumer` (``rebuild``, ``Rebuilder``, ``KafkaReader``);
- :mod:`sinks.kafka.applier` (the consumer's SQL target) and :mod:`sinks.kafka.metaread` (the metadata topic's reader);
- objects the sink and the consumer drive: :mod:`sinks.kafka.meta` (the metadata topic: layout, ``MetaTopic``),
  :mod:`sinks.kafka.outbox` (row messages per topic and partition), :mod:`sinks.kafka.target` (what the consumer hands
  a target);
- message content and routing, no I/O: ``copy_markers``, ``headers``, ``dispatcher``, ``large``, ``skipped``;
- the producers: :mod:`sinks.kafka.confluent` over :mod:`sinks.kafka.transport`; then ``holes`` (a partition's
  records without the holes a fetch answer may skip) over ``topics`` (topic management), ``logstart``, ``txnread``;
  ``errors`` (kafka-python's errors as ``cdc.errors``) and ``options``
  (the URI).

kafka-python is imported only when a transport or a reader is used (extra ``kafka``).
"""
