"""A running node agent: sampler threads, readers (OTLP, Prometheus), live view, clean shutdown."""
from __future__ import annotations

import os
import sys
import threading
import time

from .agent import Instruments, Sampler
from .agent_cli import FLUSH_TIMEOUT_S, AgentConfig, install_signal_handlers
from .export import PrometheusEndpoint, merged_resource, meter_provider, otlp_exporter, periodic_reader
from .identity import point_attributes, resource_attributes
from .node import Node
from .store import Store


class AgentRuntime:
    def __init__(self, config: AgentConfig, node: Node, env=os.environ):
        self.config = config
        self.node = node
        window_s = max(config.interval_s, config.otlp.interval_s)
        self.store = Store(window_s=window_s)
        self.sampler = Sampler(node.sources, self.store, config.interval_s)
        resource = merged_resource({**resource_attributes(env), "service.name": "otel-gpu-agent"})
        readers, self.exporter, self.endpoint = [], None, None
        if config.otlp.endpoint:
            self.exporter = otlp_exporter(config.otlp)
            readers.append(periodic_reader(self.exporter, config.otlp))
        if config.prometheus_port:
            try:
                self.endpoint = PrometheusEndpoint(config.prometheus_port, config.prometheus_host)
            except OSError as exc:
                from .cli import UsageError
                raise UsageError(f"cannot serve Prometheus on {config.prometheus_host}:{config.prometheus_port}: {exc.strerror or exc}") from None
            readers.append(self.endpoint.reader)
        self.provider = meter_provider(resource, readers)
        meter = self.provider.get_meter("otel_gpu.agent")
        exporter = self.exporter
        Instruments(meter, self.sampler, point_attributes(resource.attributes),
                    export_failures=lambda: exporter.failures if exporter else 0)
        self.stop_event = threading.Event()

    def describe_outputs(self) -> str:
        out = []
        if self.endpoint:
            out.append(f"Prometheus metrics on http://{self.endpoint.host}:{self.endpoint.port}/metrics")
        if self.config.otlp.endpoint:
            out.append(f"OTLP ({self.config.otlp.protocol}) to {self.config.otlp.endpoint} every {self.config.otlp.interval_s:g} s")
        return "; ".join(out)

    def run_until_signal(self) -> int:
        install_signal_handlers(self.stop_event)
        self.sampler.start()
        print(f"otel-gpu agent: sampling every {self.config.interval_s:g} s; {self.describe_outputs()}", file=sys.stderr, flush=True)
        if self.config.live:
            from .liveview import run_live
            run_live(self.store, self.config.interval_s, self.stop_event, self.describe_outputs())
        else:
            self.stop_event.wait()
        return self.shutdown()

    def shutdown(self) -> int:
        """Stop sampling, flush the last export, free the port: all within FLUSH_TIMEOUT_S."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S - 0.5   # leave time for the interpreter to exit
        self.sampler.stop(timeout_s=0.5)
        budget_s = max(0.1, deadline - time.monotonic())
        flush = threading.Thread(target=self.provider.shutdown, kwargs={"timeout_millis": budget_s * 1000},
                                 daemon=True)
        flush.start()
        flush.join(budget_s)    # an export still hanging on a dead backend is abandoned (and counted)
        if self.endpoint:
            self.endpoint.close()
        return 0
