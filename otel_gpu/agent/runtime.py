"""A running node agent: sampler threads, readers (OTLP, Prometheus), live view, clean shutdown."""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

from .sampler import Exported, Instruments, Sampler
from .cli import FLUSH_TIMEOUT_S, AgentConfig, install_signal_handlers
from ..children import watch_parent
from ..export import resource_attributes_without_sdk
from .exposition import Renderer, ScrapeEndpoint
from ..identity import point_attributes, resource_attributes
from .node import Node
from .store import Store


def _say(line: str) -> None:
    print(f"otel-gpu agent: {line}", file=sys.stderr, flush=True)


def parent_gone(parent: int, proc_root: str = "/proc") -> bool:
    """Whether the process that started us (`parent`) has ended or is ending: we were re-parented,
    or it is a zombie (its threads are still going when its death signal reaches us)."""
    if os.getppid() != parent:
        return True
    try:
        with open(os.path.join(proc_root, str(parent), "stat")) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


class AgentRuntime:
    def __init__(self, config: AgentConfig, node: Node, env=os.environ):
        self.config = config
        self.node = node
        window_s = max(config.interval_s, config.otlp.interval_s)
        self.store = Store(window_s=window_s)
        self.sampler = Sampler(node.sources, self.store, config.interval_s)
        ours = {**resource_attributes(env), "service.name": "otel-gpu-agent"}
        # the OTel SDK is imported only for OTLP export (or resource detectors only it knows):
        # a Prometheus-only agent stays ~7 MB smaller
        resource_attrs = None if config.otlp.endpoint else resource_attributes_without_sdk(ours, env)
        resource = None
        if resource_attrs is None:
            from ..export_sdk import merged_resource
            resource = merged_resource(ours)
            resource_attrs = dict(resource.attributes)
        point = point_attributes(resource_attrs)
        self.exporter = None
        if config.otlp.endpoint:
            from ..export_sdk import otlp_exporter
            self.exporter = otlp_exporter(config.otlp, say=_say)   # a failed export: one line, not the SDK's
        exporter = self.exporter
        self.endpoint = None
        exported = Exported(self.sampler, export_failures=lambda: exporter.failures if exporter else 0,
                            scrape_refused=lambda: self.endpoint.refused if self.endpoint else 0)
        self.provider = None
        if exporter is not None:
            from ..export_sdk import meter_provider, periodic_reader
            # shut down by `shutdown` within its budget, not again at exit (the SDK then warns on stderr)
            self.provider = meter_provider(resource, [periodic_reader(exporter, config.otlp)], shutdown_on_exit=False)
            Instruments(self.provider.get_meter("otel_gpu.agent"), exported, point)
        if config.prometheus_port:
            renderer = Renderer(exported.families, point, {k: str(v) for k, v in resource_attrs.items()})
            try:
                self.endpoint = ScrapeEndpoint(renderer.render, config.prometheus_port, config.prometheus_host)
            except OSError as exc:
                from ..errors import UsageError
                raise UsageError(f"cannot serve Prometheus on {config.prometheus_host}:{config.prometheus_port}: "
                                 f"{exc.strerror or exc}") from None
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
        if self.config.parent_pid is not None:
            watch_parent(self.config.parent_pid, self.stop_event)
        # everything built so far (modules, OTel SDK, sources) lives as long as the process:
        # keep it out of the collector's full passes, which would otherwise walk it for nothing
        gc.freeze()
        self.sampler.start()
        if self.config.live:   # the view's first line says where the metrics go: not said twice
            from .liveview import run_live
            run_live(self.store, self.config.interval_s, self.stop_event, self.describe_outputs(),
                     fake_gpus=self.config.node.fake_gpus > 0)
        else:
            print(f"otel-gpu agent: sampling every {self.config.interval_s:g} s; {self.describe_outputs()}",
                  file=sys.stderr, flush=True)
            self.stop_event.wait()
        if self.config.parent_pid is not None and parent_gone(self.config.parent_pid):
            # the run that started us is gone, and its receiver with it: nothing to flush there (a last
            # export retried against it for seconds); free the port and go now
            if self.endpoint:
                self.endpoint.close()
            sys.stderr.flush()
            os._exit(0)
        # the process is ending: whatever hangs (a stuck export, a stuck NVML call), exit on time
        watchdog = threading.Timer(FLUSH_TIMEOUT_S, os._exit, args=(0,))
        watchdog.daemon = True
        watchdog.start()
        return self.shutdown()

    def shutdown(self) -> int:
        """Stop sampling, flush the last export, free the port: all within FLUSH_TIMEOUT_S."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S - 1.5   # leave time for the interpreter to exit
        self.sampler.stop(timeout_s=0.5)
        if self.provider is not None:
            budget_s = max(0.1, deadline - time.monotonic())
            flush = threading.Thread(target=self.provider.shutdown, kwargs={"timeout_millis": budget_s * 1000},
                                     daemon=True)
            flush.start()
            flush.join(budget_s)    # an export still hanging on a dead backend is abandoned (and counted)
        if self.endpoint:
            self.endpoint.close()
        return 0
