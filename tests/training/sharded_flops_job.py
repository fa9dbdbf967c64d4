"""The FLOPs basis of sharded models, printed as JSON for test_flops_basis.py.

First, on a fake 2-rank process group (no data moves; shapes only): a tiny LLaMA from an HF config
whole, under FSDP1 (flat parameters, use_orig_params off and on), FSDP2 (DTensor), tensor
parallelism (DTensor, q/k/v/gate/up by column, o/down by row) and both (FSDP2 over "dp", tensor
parallelism over "tp" of a 2 x 2 mesh on 4 fake ranks). Then a real 1-rank ZeRO-3 job (gloo)
over a GPT-2 from an HF config with padded batches under a live otel-gpu session: the tokens and
FLOPs it counted beside the job's own mask sums and FlopCounterMode's count of the same steps.
"""
import dataclasses
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from otel_gpu.training import flops  # noqa: E402


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32))


def shape(model):
    return dataclasses.asdict(flops.model_shape(model))


def sharded() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    out = {"whole": shape(llama()), "head": llama().lm_head.weight.numel()}
    cpu = torch.device("cpu")
    out["fsdp1"] = shape(FullyShardedDataParallel(llama(), device_id=cpu))
    out["fsdp1_orig_params"] = shape(FullyShardedDataParallel(llama(), device_id=cpu, use_orig_params=True))
    out["gpt2_whole"], out["gpt2_fsdp1"] = shape(gpt2()), shape(FullyShardedDataParallel(gpt2(), device_id=cpu))
    model = llama()
    for layer in model.model.layers:
        fully_shard(layer, mesh=init_device_mesh("cpu", (2,)))
    out["fsdp2"] = shape(fully_shard(model, mesh=init_device_mesh("cpu", (2,))))
    out["tp"] = shape(parallelize_module(llama(), init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)), tp_plan()))
    dist.destroy_process_group()
    # 2-D: FSDP2 over "dp" on top of tensor parallelism over "tp", 4 fake ranks
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    mesh, model = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), llama()
    parallelize_module(model, mesh["tp"], tp_plan())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    out["fsdp2_tp"] = shape(fully_shard(model, mesh=mesh["dp"]))
    dist.destroy_process_group()
    return out


def tp_plan() -> dict:
    """Megatron's split of a LLaMA layer: q/k/v/gate/up by column, o/down by row."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {f"model.layers.{i}.{m}": style for i in range(2) for m, style in (
        ("self_attn.q_proj", ColwiseParallel()), ("self_attn.k_proj", ColwiseParallel()),
        ("self_attn.v_proj", ColwiseParallel()), ("self_attn.o_proj", RowwiseParallel()),
        ("mlp.gate_proj", ColwiseParallel()), ("mlp.up_proj", ColwiseParallel()), ("mlp.down_proj", RowwiseParallel()))}


SEQ, BATCH = 16, 4


class Padded(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(1, 256, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        mask = (torch.arange(SEQ) < SEQ - i % 5).long()
        return {"input_ids": self.ids[i] * mask, "attention_mask": mask}


def gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4,
                                      bos_token_id=0, eos_token_id=0))


def zero3(steps: int = 3) -> dict:
    import deepspeed
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu.training import session, torch_hooks

    s = session._session = session.Session({}, readers=[InMemoryMetricReader()], profile=False, host="h")
    torch_hooks.install()
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True, "steps_per_print": 1000}
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = gpt2()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    out = {"shape": shape(engine), "empty_shards": all(p.numel() == 0 for p in model.parameters())}
    tokens, truth = 0, 0.0
    for batch in torch.utils.data.DataLoader(Padded(steps * BATCH), batch_size=BATCH):
        mask = batch["attention_mask"]
        tokens += int(mask.sum())
        with FlopCounterMode(display=False) as counter:
            loss = engine(input_ids=batch["input_ids"], attention_mask=mask, labels=batch["input_ids"]).loss
            engine.backward(loss)
        truth += counter.get_total_flops() * float(mask.sum()) / mask.numel()
        engine.step()
    (obs,) = s.sink._observe_flops(None)
    out.update(tokens=s.sink.tokens_counted, flops=obs.value, truth_tokens=tokens, truth_flops=truth)
    torch_hooks.uninstall()
    s.shutdown(1.0)
    return out


if __name__ == "__main__":
    result = sharded()
    result["zero3_whole"] = shape(gpt2())
    result["zero3"] = zero3()
    dist.destroy_process_group()
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)   # skip the interpreter's teardown: DeepSpeed's CPU comm op takes seconds to unload
