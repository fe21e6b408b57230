"""Micro-benchmark: the Kafka protocol library for the Kafka listener's hot path.

Both candidates are generated from Apache Kafka's JSON message schemas: `kio` (dataclasses,
a native reader, a Python writer) and kafka-python 3's `kafka.protocol` (schemas loaded at
import time, pure Python). The listener's hot path is decoding a Produce or Fetch request and
encoding its response, so this times exactly that round, per library, on the shapes a
producer and a consumer under load send: Produce v9 with 16 partitions of one 64 KiB record
batch each, and Fetch v12 answering 16 partitions with 64 KiB of batches each. Record
batches are opaque bytes in both (neither library decodes them here).

Reports `<library>_<api>_us` (one decode of the request plus one encode of the response,
microseconds, the fastest of five timings) and `kio_vs_kafka_python_<api>` (how many times
faster kio is).
"""

from __future__ import annotations

import io
import pathlib
import random
import statistics
import sys
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from record_validation import _seconds_per_call  # the same timing rule

PARTITIONS = 16
BATCH_BYTES = 64 * 1024
TOPIC = "bench-topic"


class _Chunks:
    """A writer target that keeps each written piece, so record batches are referenced, not
    copied, on their way to the socket (`transport.writelines`)."""

    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.chunks.append(data)
        return len(data)


def _kio_rounds(batch: bytes) -> dict[str, Callable[[], object]]:
    from kio.schema.fetch.v12 import request as fetch_req
    from kio.schema.fetch.v12 import response as fetch_resp
    from kio.schema.produce.v9 import request as produce_req
    from kio.schema.produce.v9 import response as produce_resp
    from kio.serial import entity_reader, entity_writer
    from kio.static.primitive import Records, i16, i32, i32Timedelta, i64

    produce = produce_req.ProduceRequest(
        acks=i16(-1),
        timeout=i32Timedelta.parse(__import__("datetime").timedelta(seconds=30)),
        topic_data=(
            produce_req.TopicProduceData(
                name=produce_req.TopicName(TOPIC),
                partition_data=tuple(
                    produce_req.PartitionProduceData(index=i32(p), records=Records(batch))
                    for p in range(PARTITIONS)
                ),
            ),
        ),
    )
    buffer = io.BytesIO()
    entity_writer(produce_req.ProduceRequest)(buffer, produce)
    produce_bytes = buffer.getvalue()
    fetch = fetch_req.FetchRequest(
        replica_id=fetch_req.BrokerId(-1),
        max_wait=i32Timedelta.parse(__import__("datetime").timedelta(milliseconds=500)),
        min_bytes=i32(1),
        topics=(
            fetch_req.FetchTopic(
                topic=fetch_req.TopicName(TOPIC),
                partitions=tuple(
                    fetch_req.FetchPartition(
                        partition=i32(p), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
                    )
                    for p in range(PARTITIONS)
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    buffer = io.BytesIO()
    entity_writer(fetch_req.FetchRequest)(buffer, fetch)
    fetch_bytes = buffer.getvalue()
    read_produce = entity_reader(produce_req.ProduceRequest)
    read_fetch = entity_reader(fetch_req.FetchRequest)
    write_produce = entity_writer(produce_resp.ProduceResponse)
    write_fetch = entity_writer(fetch_resp.FetchResponse)

    def produce_round() -> object:
        request, _ = read_produce(produce_bytes, 0)
        response = produce_resp.ProduceResponse(
            responses=tuple(
                produce_resp.TopicProduceResponse(
                    name=topic.name,
                    partition_responses=tuple(
                        produce_resp.PartitionProduceResponse(
                            index=p.index,
                            error_code=produce_resp.ErrorCode.none,
                            base_offset=i64(100),
                            log_append_time=None,
                            log_start_offset=i64(0),
                            record_errors=(),
                        )
                        for p in topic.partition_data
                    ),
                )
                for topic in request.topic_data
            ),
            throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0)),
        )
        out = io.BytesIO()
        write_produce(out, response)
        return out.getvalue()

    def fetch_round() -> object:
        request, _ = read_fetch(fetch_bytes, 0)
        response = fetch_resp.FetchResponse(
            throttle_time=i32Timedelta.parse(__import__("datetime").timedelta(0)),
            error_code=fetch_resp.ErrorCode.none,
            session_id=i32(0),
            responses=tuple(
                fetch_resp.FetchableTopicResponse(
                    topic=topic.topic,
                    partitions=tuple(
                        fetch_resp.PartitionData(
                            partition_index=p.partition,
                            error_code=fetch_resp.ErrorCode.none,
                            high_watermark=i64(1000),
                            last_stable_offset=i64(1000),
                            log_start_offset=i64(0),
                            aborted_transactions=None,
                            records=Records(batch),
                        )
                        for p in topic.partitions
                    ),
                )
                for topic in request.topics
            ),
        )
        out = _Chunks()
        write_fetch(out, response)
        return out.chunks

    return {"produce": produce_round, "fetch": fetch_round}


def _kafka_python_rounds(batch: bytes) -> dict[str, Callable[[], object]]:
    from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

    request = ProduceRequest(
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=TOPIC,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=batch)
                    for p in range(PARTITIONS)
                ],
            )
        ],
    )
    produce_bytes = request.encode(version=9)
    fetch = FetchRequest(
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        topics=[
            FetchRequest.FetchTopic(
                topic=TOPIC,
                partitions=[
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=p, fetch_offset=0, partition_max_bytes=1 << 20
                    )
                    for p in range(PARTITIONS)
                ],
            )
        ],
        forgotten_topics_data=[],
    )
    fetch_bytes = fetch.encode(version=12)
    Topic = ProduceResponse.TopicProduceResponse
    Part = Topic.PartitionProduceResponse
    FTopic = FetchResponse.FetchableTopicResponse
    FPart = FTopic.PartitionData

    def produce_round() -> object:
        decoded = ProduceRequest.decode(produce_bytes, version=9)
        response = ProduceResponse(
            responses=[
                Topic(
                    name=t.name,
                    partition_responses=[
                        Part(index=p.index, error_code=0, base_offset=100, log_start_offset=0)
                        for p in t.partition_data
                    ],
                )
                for t in decoded.topic_data
            ],
            throttle_time_ms=0,
        )
        return response.encode(version=9)

    def fetch_round() -> object:
        decoded = FetchRequest.decode(fetch_bytes, version=12)
        response = FetchResponse(
            throttle_time_ms=0,
            error_code=0,
            session_id=0,
            responses=[
                FTopic(
                    topic=t.topic,
                    partitions=[
                        FPart(
                            partition_index=p.partition,
                            error_code=0,
                            high_watermark=1000,
                            last_stable_offset=1000,
                            log_start_offset=0,
                            records=batch,
                        )
                        for p in t.partitions
                    ],
                )
                for t in decoded.topics
            ],
        )
        return response.encode(version=12)

    return {"produce": produce_round, "fetch": fetch_round}


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    """The libraries alternate in short rounds (the machine is shared); each figure is the
    median over rounds, each ratio the median of per-round ratios."""
    batch = random.Random(20261126).randbytes(BATCH_BYTES)
    rounds, budget_s = (3, 0.3) if quick else (9, 0.5)
    libraries = {"kio": _kio_rounds(batch), "kafka_python": _kafka_python_rounds(batch)}
    timings: dict[str, list[float]] = {}
    for _ in range(rounds):
        for library, actions in libraries.items():
            for api, action in actions.items():
                seconds = _seconds_per_call(action, budget_s)
                timings.setdefault(f"{library}_{api}_us", []).append(seconds * 1e6)
    metrics = {name: statistics.median(values) for name, values in timings.items()}
    for api in ("produce", "fetch"):
        ratios = [
            other / kio
            for kio, other in zip(
                timings[f"kio_{api}_us"], timings[f"kafka_python_{api}_us"], strict=True
            )
        ]
        metrics[f"kio_vs_kafka_python_{api}"] = statistics.median(ratios)
    return metrics


if __name__ == "__main__":
    for name, value in run(pathlib.Path("."), quick=True).items():
        print(f"{name:<32} {value:10.2f}")
