"""Kafka sink parts: the ``kafka://`` URI (:mod:`sinks.kafka.options`), the transport that delivers messages
(:mod:`sinks.kafka.transport`), topic management (:mod:`sinks.kafka.topics`) and kafka-python's errors mapped to
``cdc.errors`` (:mod:`sinks.kafka.errors`). kafka-python is imported only when a transport is used (extra
``kafka``)."""
