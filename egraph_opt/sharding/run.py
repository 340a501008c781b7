"""Running a sharded program on real devices: one process per device over torch.distributed (gloo on CPU, NCCL on
CUDA), each evaluating the same Terms with ``lang/mesh.py`` acting as its device."""
from __future__ import annotations

import atexit
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.utils.distributed import get_free_port as free_port

from ..lang import mesh
from ..kernels.torch_ops import TORCH
from ..lang.term import Term, evaluate

#: bytes per collective that ``profile_collectives`` times: 4 KB to 4 MB of float32
COLLECTIVE_SIZES = (1024, 16384, 131072, 1048576)


def device_of_this_process(n: int) -> mesh.Device:
    """This process's place in the initialized default process group; collectives are DTensor redistributions:
    a ``Shard(axis)`` part (a ``Partial`` sum) made ``Replicate`` on a 1-D device mesh of the group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard
    if dist.get_world_size() != n:
        raise mesh.MeshError(f"the plan is sharded over {n} devices; this process group has {dist.get_world_size()}")
    grid = init_device_mesh("cuda" if dist.get_backend() == "nccl" else "cpu", (n,))
    def all_gather(x: torch.Tensor, axis: int) -> torch.Tensor:
        return DTensor.from_local(x.contiguous(), grid, [Shard(axis % x.dim())], run_check=False).full_tensor()
    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        return DTensor.from_local(x.contiguous(), grid, [Partial()], run_check=False).full_tensor()
    return mesh.Device(dist.get_rank(), n, all_gather, all_reduce)


def run_here(roots: list[Term], env: dict, n: int) -> list:
    """Evaluate the program as this process's device (the process group is initialized)."""
    with mesh.on_device(device_of_this_process(n)):
        return evaluate(roots, env, kernels=TORCH)


def backend_for(env: dict) -> str:
    return "nccl" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in env.values()) else "gloo"


def _device(rank: int, n: int, port: int, backend: str, threads: int | None, work, args: tuple, path: str) -> None:
    """One process of the mesh: joins the group, runs ``work(n, *args)``, and device 0 keeps its
    result at ``path`` (a file: a pipe would block this process until the caller reads it)."""
    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        found = work(n, *args)
        if rank == 0:
            torch.save(found, path)
        dist.barrier()  # no process closes a pair another still uses: gloo aborts (SIGABRT) that peer
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # done: no interpreter teardown, where gloo's threads can abort (SIGABRT) a device


def _on_mesh(n: int, backend: str, threads: int | None, work, *args):
    """``work(n, *args)`` on ``n`` new processes; what device 0's returned."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "result.pt")
        mp.start_processes(_device, args=(n, free_port(), backend, threads, work, args, path), nprocs=n,
                           join=True, start_method="spawn")
        return torch.load(path)


def _slowest(repeats: int, call, *args) -> list[float]:
    """Seconds of each of ``repeats`` runs of ``call(*args)``: devices start together, a run ends with the last."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        call(*args)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    return times


def _program(n: int, roots, env: dict, repeats: int) -> tuple[list, list[float]]:
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        env = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in env.items()}
    outputs, times = run_here(roots, env, n), _slowest(repeats, run_here, roots, env, n)
    return [o.cpu() if isinstance(o, torch.Tensor) else o for o in outputs], times


def spawn(roots: list[Term], env: dict, n: int, repeats: int = 0, threads: int | None = None
          ) -> tuple[list, float | None]:
    """Run on ``n`` new processes of ``threads`` threads each (default: the cores shared out):
    device 0's outputs and, with ``repeats``, a run's median seconds, the slowest device counted."""
    threads = threads or max(1, (os.cpu_count() or 1) // n)
    outputs, times = _on_mesh(n, backend_for(env), threads, _program, roots, env, repeats)
    return outputs, statistics.median(times) if times else None


def run_local(roots: list[Term], env: dict, n: int) -> list:
    """This process's part, under torchrun (or any launcher that sets the env:// variables)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise mesh.MeshError("run_local runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR "
                                 "unset); plan.run starts the processes itself")
        dist.init_process_group(backend_for(env))
        atexit.register(_leave)  # the group this call made ends with the script
    return run_here(roots, env, n)


def _leave() -> None:
    """No rank tears down connections another still uses: gloo aborts (SIGABRT) a peer whose pair closes under it."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _collectives(n: int, sizes, repeats: int) -> list[tuple]:
    device = device_of_this_process(n)
    calls = {"all_gather": lambda x: device.all_gather(x, 0), "all_reduce": device.all_reduce,
             "reduce_scatter": lambda x: mesh.reduce_scatter(x, 0, n)}
    found = []
    with mesh.on_device(device):
        for (name, call), size in ((c, s) for c in calls.items() for s in sizes):
            times = _slowest(repeats + 2, call, torch.randn(size))  # two warm-ups
            moved = size * 4 * (n if name == "all_gather" else 1)  # the cost model's bytes
            found.append((name, moved, min(times[2:])))  # the machine is shared: the quickest
            # run is the link's own time, the rest other processes' interference
    return found


def profile_collectives(n: int = 2, sizes=COLLECTIVE_SIZES, repeats: int = 20) -> list[tuple]:
    """(collective, bytes, least seconds of ``repeats``) over ``n`` gloo processes here."""
    return _on_mesh(n, "gloo", None, _collectives, sizes, repeats)
