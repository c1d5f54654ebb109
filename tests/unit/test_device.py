"""engine/device.py: a worker makes its CUDA device current (Triton and CUDA graphs use the current
device, not the tensors'); on CPU it touches nothing CUDA."""

import pytest
import torch

from engine.device import use_device


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", seen.append)
    return seen


@pytest.mark.parametrize("device, expected", [("cuda:1", [1]), ("cuda:0", [0]), ("cuda", []), ("cpu", [])])
def test_use_device_sets_the_named_cuda_device(calls, device, expected):
    use_device(device)
    assert calls == expected


def test_a_worker_sets_its_device_before_it_loads_anything(monkeypatch, calls):
    """build_runtime() makes model.device current right after the start-up checks, before the model is prepared."""
    from pdorch.config_loader import load_config
    from pdorch.worker import runtime

    class Stop(Exception):
        pass

    def prepare(cfg, tp_size):
        assert calls == [2], "prepare ran before the device was made current"
        raise Stop

    monkeypatch.setattr(runtime, "prepare", prepare)
    monkeypatch.setattr("pdorch.worker.startup_checks.check_startup", lambda cfg: None)
    cfg = load_config(None, {"model.device": "cuda:2"}, environ={})
    with pytest.raises(Stop):
        runtime.build_runtime(cfg, num_pages=16, use_store=False)


# --- every thread that does device work selects the device first -----------------------------------
# CUDA's current device is per thread and a new thread starts on device 0. Two fake devices: set_device
# records the index in the calling thread; a thread that never called it is on device 0.

import threading

from engine.device import device_initializer


class FakeDevices:
    def __init__(self):
        self._local = threading.local()

    def set_device(self, index: int) -> None:
        self._local.index = index

    def current(self) -> int:
        return getattr(self._local, "index", 0)


@pytest.fixture
def devices(monkeypatch):
    fake = FakeDevices()
    monkeypatch.setattr(torch.cuda, "set_device", fake.set_device)
    use_device("cuda:1")  # the worker's main thread, as build_runtime does
    assert fake.current() == 1
    return fake


def on_worker_thread(devices, start) -> int:
    """The fake device current in the thread that `start(record)` runs `record` on."""
    seen = []
    done = threading.Event()

    def record(*_args, **_kwargs):
        seen.append(devices.current())
        done.set()

    stop = start(record)
    try:
        assert done.wait(10), "the worker thread never ran"
    finally:
        stop()
    return seen[0]


def test_the_scheduler_thread_runs_on_the_workers_device(devices):
    from pdorch.worker.loop import SchedulerLoop

    def start(record):
        loop = SchedulerLoop("decode", lambda now: record() or False, lambda msg: None, lambda err: None,
                             thread_init=device_initializer("cuda:1"))
        loop.start()
        return loop.stop
    assert on_worker_thread(devices, start) == 1


def test_store_io_threads_run_on_the_workers_device(devices):
    from store_client.io_thread import StoreIO
    from tests.unit.test_store_io import FakeStore

    def start(record):
        store = FakeStore(io_threads=2)
        store.load_many = lambda requests: record() or []
        io = StoreIO(store, thread_init=device_initializer("cuda:1"))
        io.submit_load("tag", ["k"], [0])
        return io.close
    assert on_worker_thread(devices, start) == 1


def test_kv_push_threads_run_on_the_workers_device(devices):
    from types import SimpleNamespace

    from prefill_node.pusher import KVPusher

    def start(record):
        pusher = KVPusher(SimpleNamespace(write=record), 64, thread_init=device_initializer("cuda:1"))
        task = SimpleNamespace(push=SimpleNamespace(begin=lambda: True, end=lambda **kw: None), request_id="r",
                               job=SimpleNamespace(decode_segment="d", decode_ranks=[]))
        pusher.push(task, [0], [0], lambda *a: None)
        return lambda: pusher._pool.shutdown(wait=True)
    assert on_worker_thread(devices, start) == 1


def test_grpc_handler_threads_run_on_the_workers_device(devices):
    import grpc

    from pdorch.config import GrpcConfig
    from pdorch.worker.main import make_server

    def start(record):
        server = make_server(GrpcConfig(), 4, thread_init=device_initializer("cuda:1"))
        handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: record() or b"ok")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"M": handler})])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            channel.unary_unary("/t.T/M")(b"", timeout=10)
        return lambda: server.stop(0).wait(5)
    assert on_worker_thread(devices, start) == 1


def test_the_tp_heartbeat_runs_on_the_workers_device(devices):
    from pdorch.worker.tp_steps import StepChannel

    def start(record):
        channel = StepChannel(None, lambda e: None, dead_ranks=lambda: record() or [],
                              thread_init=device_initializer("cuda:1"))
        channel.start_heartbeat()

        def stop():
            channel._stop.set()
            channel._heartbeat.join(5)
        return stop
    assert on_worker_thread(devices, start) == 1


def test_a_decode_worker_on_cuda_1_runs_its_forwards_there(devices, tmp_path, tiny_model_dir, monkeypatch):
    """The wiring: a real DecodeWorker whose config names cuda:1 (its tiny model computes on the CPU
    here) runs every forward of a request on device 1, not on the scheduler thread's default 0. The
    prefill answer is a small fake (P is not what this checks)."""
    import dataclasses

    from decode_node.request import GenerateJob
    from decode_node.worker import DecodeWorker
    from engine.model_runner import ModelRunner
    from engine.sampling_params import SamplingParams
    from pdorch.local_stack.workers import make_config
    from pdorch.worker.metrics import WorkerRecorder
    from pdorch.worker.prefill_rpc import PrefillResult
    from pdorch.worker.runtime import build_runtime

    cfg = make_config(tmp_path, tiny_model_dir, decode={"num_pages": 32})
    rt = build_runtime(cfg, cfg.decode.num_pages, use_store=False)
    rt.cfg = dataclasses.replace(rt.cfg, model=dataclasses.replace(rt.cfg.model, device="cuda:1"))
    forwards = []
    real = ModelRunner.forward
    monkeypatch.setattr(ModelRunner, "forward", lambda self, chunks: forwards.append(devices.current())
                        or real(self, chunks))
    w = DecodeWorker(rt, rt.cfg.decode, rt.cfg.store, rt.cfg.grpc, "d-device", WorkerRecorder("decode"))
    monkeypatch.setattr(w.prefill_client, "prefill", lambda address, job, timeout_s, is_cancelled: PrefillResult(
        request_id=job.request_id, first_token_id=42, prompt_tokens=len(job.token_ids)))
    try:
        job = GenerateJob(request_id="dev", token_ids=tuple(range(10, 30)),
                          params=SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                          prefill_address="127.0.0.1:1", timeout_s=30.0)
        events = list(w.run(w.create(job)))
    finally:
        w.close()
    assert sum(len(e.token_ids) for e in events) == 3
    assert forwards and set(forwards) == {1}, forwards
