"""The ``cdc`` command, on top of every other package (DESIGN.md section 7): argument parsing and the API client
commands (:mod:`cli.main`), ``cdc server`` (:mod:`cli.server`), ``cdc cli kafka-consumer``
(:mod:`cli.kafka_consumer`), output (:mod:`cli.render`) and the initial copy's live progress (:mod:`cli.progress`).
It may import anything of Tidewater; nothing imports it (the playground's demo reuses its progress display).
"""
