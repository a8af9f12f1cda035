"""cdc cli kafka-consumer: where it reads, from --broker/--topic/--protocol or from the changefeed's own kafka://
sink URI (brokers, topic, protocol, codec options, TLS, SASL), and its refusals (no broker is contacted here: the
TLS/SASL settings are checked as kafka-python receives them; the plaintext path runs against tansu in
tests/e2e/test_kafka_e2e.py)."""

from __future__ import annotations

import argparse
import json
import ssl
from pathlib import Path

import pytest

from cli.args import CliError
from cli.kafka_consumer import ENV_KAFKA_URI, source_of
from cli.main import build_parser, main
from tests.tls_material import make_tls_material

pytestmark = pytest.mark.unit


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["cli", "kafka-consumer", "--sink-uri", "sqlite:///t.db", *argv])


def test_the_changefeed_uri_gives_brokers_topic_protocol_codec_tls_and_sasl(tmp_path: Path) -> None:
    tls = make_tls_material(tmp_path)
    uri = (f"kafka://b1:9093,b2:9093/orders?protocol=canal-json&enable-tidb-extension=false&enable-tls=true"
           f"&ca={tls.ca_cert}&sasl-mechanism=scram-sha-512&sasl-user=cdc&sasl-password=s3cret-pw"
           "&large-message-handle-option=handle-key-only&partition-num=3")
    src = source_of(_args("--kafka-uri", uri))
    assert src.brokers == ["b1:9093", "b2:9093"] and src.topics == ["orders"] and src.protocol == "canal-json"
    assert src.codec is not None and src.codec.enable_tidb_extension is False
    assert src.client["security_protocol"] == "SASL_SSL"
    assert src.client["sasl_mechanism"] == "SCRAM-SHA-512" and src.client["sasl_plain_username"] == "cdc"
    assert src.client["sasl_plain_password"] == "s3cret-pw"
    assert isinstance(src.client["ssl_context"], ssl.SSLContext)
    assert src.client["ssl_context"].verify_mode is ssl.CERT_REQUIRED
    assert not {"bootstrap_servers", "client_id", "request_timeout_ms"} & set(src.client)  # the consumer's own


def test_topics_given_beside_the_uri_replace_its_topic_and_a_plain_uri_is_plaintext() -> None:
    src = source_of(_args("--kafka-uri", "kafka://127.0.0.1:9092/a?protocol=debezium", "--topic", "b", "--topic", "c"))
    assert src.topics == ["b", "c"] and src.protocol == "debezium" and src.client == {"security_protocol": "PLAINTEXT"}


def test_the_metadata_topic_with_the_copy_markers_is_the_sink_uris_unless_named() -> None:
    """The copies' chunk markers are in ``_tidewater.<the sink URI's topic>`` (docs/sinks.md, "Copy markers"), also
    when --topic names the dispatchers' topics."""
    uri = "kafka://127.0.0.1:9092/a?protocol=canal-json"
    assert source_of(_args("--kafka-uri", uri, "--topic", "b")).meta_topic == "_tidewater.a"
    assert source_of(_args("--kafka-uri", uri, "--meta-topic", "m")).meta_topic == "m"
    assert source_of(_args("--broker", "h:1", "--topic", "t", "--protocol", "canal-json")).meta_topic is None


def test_the_uri_from_a_file_or_the_environment_keeps_the_password_out_of_ps(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "kafka.uri"
    f.write_text("# the changefeed's sink\nkafka://k:9092/t?protocol=open-protocol&sasl-mechanism=plain"
                 "&sasl-user=u&sasl-password=pw-in-file\n")
    assert source_of(_args("--kafka-uri-file", str(f))).client["sasl_plain_password"] == "pw-in-file"
    monkeypatch.setenv(ENV_KAFKA_URI, "kafka://k:9092/t2?protocol=canal-json")
    assert source_of(_args()).topics == ["t2"]


def test_old_style_arguments_still_work_and_missing_ones_are_named() -> None:
    src = source_of(_args("--broker", "h:1", "--topic", "t", "--protocol", "canal-json"))
    assert (src.brokers, src.topics, src.protocol, src.client) == (["h:1"], ["t"], "canal-json", {})
    with pytest.raises(CliError, match="--kafka-uri") as missing:
        source_of(_args("--broker", "h:1"))
    assert missing.value.exit_code == 2
    with pytest.raises(CliError, match="give one of them"):
        source_of(_args("--broker", "h:1", "--kafka-uri", "kafka://k:9092/t?protocol=canal-json"))
    with pytest.raises(CliError, match="differs"):
        source_of(_args("--protocol", "debezium", "--kafka-uri", "kafka://k:9092/t?protocol=canal-json"))


def test_a_bad_uri_exits_2_naming_the_parameter_without_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["cli", "kafka-consumer", "--sink-uri", "sqlite:///t.db", "--kafka-uri",
               "kafka://k:9092/t?protocol=canal-json&sasl-mechanism=plain&sasl-user=u&sasl-password=hunter2-pw"
               "&sasl-mechansim=x"])
    err = capsys.readouterr().err
    assert rc == 2, err
    body = json.loads(err)
    assert "sasl-mechansim" in body["error_msg"] and "hunter2-pw" not in err
