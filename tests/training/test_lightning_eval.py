"""Lightning's validation as the "eval" phase (otel_gpu/training/lightning.py), in-process with a real
session, torch and a real `lightning.pytorch.Trainer` on CPU: validation mid-epoch is eval, its first
batch (which Lightning fetches before `on_validation_start`) included, never a step, never step time,
never data_wait or forward; the sanity check before the first batch counts nowhere. And the timer's
uncounted phase that holds the sanity check, on its own."""
import time

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from otel_gpu.training import session, torch_hooks  # noqa: E402
from otel_gpu.training.timing import Timer  # noqa: E402

TRAIN_S, VAL_S, FETCH_S = 0.01, 0.03, 0.02   # host seconds: a training step, a validation step, a validation batch
STEPS, EVERY, VAL_BATCHES, SANITY = 6, 3, 2, 2


class Recorder:
    """A timer sink keeping steps, phase seconds and collective waits."""

    def __init__(self, inner=None):
        self.inner, self.steps, self.phases, self.waits = inner, [], {}, []

    def step(self, seconds, samples, tokens):
        self.steps.append(seconds)
        if self.inner is not None:
            self.inner.step(seconds, samples, tokens)

    def phase(self, name, seconds):
        self.phases[name] = self.phases.get(name, 0.0) + seconds
        if self.inner is not None:
            self.inner.phase(name, seconds)

    def checkpoint(self, event):
        if self.inner is not None:
            self.inner.checkpoint(event)

    def collective(self, kind, phase, seconds):
        self.waits.append((kind, phase, seconds))
        if self.inner is not None:
            self.inner.collective(kind, phase, seconds)


def test_uncounted_phase_holds_hooks_off_and_counts_nowhere():
    now = [0.0]
    sink = Recorder()
    t = Timer(sink, clock=lambda: now[0])
    t.enter("eval", counted=False)
    now[0] += 2.0
    t.enter("eval")                       # a validation pass inside the sanity check: the same uncounted pass
    assert t.current_phase() == "eval"
    now[0] += 1.0
    began = t.wait_begin()                # its metric all-reduce: nobody's wait
    now[0] += 0.5
    t.wait_end("all_reduce", began)
    began = t.wait_begin()
    now[0] += 0.25
    t.wait_end("barrier", began)
    assert t.phase_totals() == {}         # open: nothing read live either
    t.exit("eval")
    t.enter("checkpoint")                 # a phase opened inside it still counts
    now[0] += 0.5
    t.exit("checkpoint")
    t.exit("eval")
    assert t.current_phase() is None
    assert sink.phases == {"checkpoint": 0.5} and sink.waits == [] and sink.steps == []
    assert t.phase_totals() == {"checkpoint": 0.5}
    t.enter("eval")                       # the next pass counts
    now[0] += 1.5
    t.exit("eval")
    assert sink.phases == {"checkpoint": 0.5, "eval": 1.5}


@pytest.fixture
def recorder():
    old = session._session
    s = session._session = session.Session({}, readers=[InMemoryMetricReader()], profile=False, host="h")
    torch_hooks.uninstall()
    torch_hooks.install()
    s.timer.sink = rec = Recorder(s.timer.sink)
    rec.timer = s.timer
    yield rec
    torch_hooks.uninstall()
    s.shutdown(1.0)
    session._session = old


class SlowBatches(torch.utils.data.Dataset):
    """Batches that take `seconds` each to produce (a decode): the validation set's."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds
        self.x, self.y = torch.randn(n, 4, 8), torch.randn(n, 4, 2)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return self.x[i], self.y[i]


class SlowStream(torch.utils.data.IterableDataset):
    """The same batches as a stream with no length: Lightning fetches the first one ahead, before
    `on_validation_start`."""

    def __init__(self, n: int, seconds: float):
        self.batches = SlowBatches(n, seconds)

    def __iter__(self):
        return (self.batches[i] for i in range(self.batches.n))


@pytest.mark.parametrize("val_set", [SlowBatches, SlowStream])
def test_lightning_validation_is_eval_and_the_sanity_check_counts_nowhere(recorder, val_set):
    L = pytest.importorskip("lightning.pytorch", reason="lightning not installed (otel-gpu[train])")
    from otel_gpu.training.lightning import OtelGpuCallback

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            time.sleep(TRAIN_S)
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def validation_step(self, batch, batch_idx):
            time.sleep(VAL_S)
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.lin(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Passes(L.Callback):
        def __init__(self):
            self.passes = self.sanity = 0
            self.val_s = 0.0

        def on_validation_start(self, trainer, pl_module):
            self.t0 = time.perf_counter()

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                self.sanity += 1
            else:
                self.passes += 1
                self.val_s += time.perf_counter() - self.t0

    passes = Passes()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(5 * STEPS, 4, 8),
                                                                       torch.randn(5 * STEPS, 4, 2)), batch_size=None)
    val = torch.utils.data.DataLoader(val_set(VAL_BATCHES, FETCH_S), batch_size=None)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, val_check_interval=EVERY,
                        limit_val_batches=1.0, num_sanity_val_steps=SANITY, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[passes, OtelGpuCallback()])
    trainer.fit(Net(), train, val)
    assert passes.sanity == 1 and passes.passes == STEPS // EVERY   # mid-epoch: after batches 3 and 6 of 30

    rec = recorder
    totals = rec.timer.phase_totals()
    one_pass = VAL_BATCHES * (VAL_S + FETCH_S)
    # every training batch is one step, none added by validation or the sanity check, none holding a pass
    assert len(rec.steps) == STEPS, rec.steps
    assert max(rec.steps) < TRAIN_S + 0.5 * one_pass, rec.steps
    # eval: the passes during training, each with the batch fetched before on_validation_start
    # (longer than the user's on_validation_start .. end), without the sanity check's pass
    assert totals["eval"] >= passes.passes * one_pass and totals["eval"] > passes.val_s, (totals, passes.val_s)
    assert totals["eval"] < passes.passes * one_pass + 0.5 * SANITY / VAL_BATCHES * one_pass, totals
    # no validation batch is data_wait, no validation forward (the sanity check's included) is forward
    assert totals.get("data_wait", 0.0) < FETCH_S, totals
    assert totals["forward"] < STEPS * TRAIN_S + 0.5 * SANITY * VAL_S, totals
    assert not [w for w in rec.waits if w[1] == "eval"]   # one process: no collective at all
