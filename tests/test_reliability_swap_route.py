"""The builtin server's weight-swap route as an attack surface, over real HTTP on 127.0.0.1.

A drafter swap carries tensors by name, dtype and shape, within the size of the launch's drafter: the server
reads those and nothing else. Hostile payloads (a memo index that would allocate gigabytes, a storage larger
than its bytes, torch's file-descriptor and socket reductions) get a 4xx naming ``serialized_named_tensors``
and never a 500, internal text or a traceback; a 409'd update can be retried with the same body; the typed
fields are SGLang's, and ``weight_version`` is reported where SGLang reports it.
"""

from __future__ import annotations

import base64
import gc
import io
import os
import pickle
import socket

import pytest
import torch

from draftlab.benchmark import drafter_swap
from httpcall import call
from swapkit import served, tiny_folders

FIELD = "serialized_named_tensors"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tiny_folders(tmp_path_factory.mktemp("swaproute"))


@pytest.fixture()
def server(folders):
    with served(folders) as url:
        yield url


def _update(url: str, entry, **extra):
    """One update inside its own session: (status, reply)."""
    assert call(url + "/begin_weight_update", {"selector": "draft"})[0] == 200
    try:
        return call(url + "/update_weights_from_tensor",
                    {"serialized_named_tensors": [entry], "selector": "draft", **extra}, timeout=60.0)
    finally:
        assert call(url + "/end_weight_update", {})[0] == 200


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _refused(status, reply, *words):
    assert 400 <= status < 500, (status, reply)
    msg = reply["message"]
    assert FIELD in msg and all(w in msg for w in words), msg
    assert "Traceback" not in msg and "enforce" not in msg.lower() and "internal" not in msg, msg


def _checksums(url):
    return drafter_swap.server_checksums(url)["checksums"]


def test_a_memo_index_that_would_allocate_gigabytes_is_refused_before_unpickling(server):
    # LONG_BINPUT 2**30: the C unpickler grows its memo array to the index (8 GB of pointers) before anything
    raw = b"\x80\x04]r\x00\x00\x00\x40."
    before = _checksums(server)
    _refused(*_update(server, _b64(raw)), "memo index")
    assert _checksums(server) == before


def test_a_storage_larger_than_its_bytes_or_than_any_drafter_tensor_is_refused(server, folders):
    named = drafter_swap.drafter_tensors(folders["other"], "builtin")
    good = pickle.dumps(named[:1], protocol=4)
    # declare 2**40 elements in the storage record's header (the bytes are not there)
    name, t = named[0]
    numel = t.numel().to_bytes(8, "little")
    forged = good.replace(numel, (2 ** 40).to_bytes(8, "little"), 1)
    _refused(*_update(server, _b64(forged)))
    # a tensor of a shape the drafter does not hold, viewed with stride 0 over four bytes (a 400 MB expand)
    big = torch.zeros(1).as_strided((10000, 10000), (0, 0))
    raw = pickle.dumps([(name, big)], protocol=4)  # pickles its one-element storage
    _refused(*_update(server, _b64(raw)), "shape")


def test_bytes_and_other_constructors_are_refused(server):
    class Alloc:
        def __reduce__(self):
            return (bytes, (400_000_000,))

    _refused(*_update(server, _b64(pickle.dumps([("fc.weight", Alloc())], protocol=4))), "builtins.bytes")


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fd_and_socket_reductions_are_refused_and_never_dialled(server, folders, tmp_path):
    """ForkingPickler's default (file-descriptor) strategy names the sender's resource-sharer address: the server
    must neither connect to it nor duplicate descriptors; a forged address is a listener of the test's own."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as tmp_mp

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    addr = str(tmp_path / "sharer.sock")
    listener.bind(addr)
    listener.listen(4)
    listener.settimeout(0.5)
    old = tmp_mp.get_sharing_strategy()
    tmp_mp.set_sharing_strategy("file_descriptor")
    try:
        named = drafter_swap.drafter_tensors(folders["other"], "builtin")
        buf = io.BytesIO()
        ForkingPickler(buf).dump(named)
        raw = buf.getvalue()
    finally:
        tmp_mp.set_sharing_strategy(old)
    fds = _fd_count()
    for _ in range(2):
        _refused(*_update(server, _b64(raw)), "out of band")

    # a payload whose DupFd names the test's listener
    class Dial:
        def __reduce__(self):
            from multiprocessing import resource_sharer
            d = resource_sharer.DupFd.__new__(resource_sharer.DupFd)
            d._id = (addr, 1)
            return (tmp_mp.reductions.rebuild_storage_fd, (torch.UntypedStorage, d, 4))

    raw = pickle.dumps([("fc.weight", Dial())], protocol=4)
    _refused(*_update(server, _b64(raw)), "rebuild_storage_fd", "out of band")
    with pytest.raises(TimeoutError):
        listener.accept()  # nobody dialled the address the payload named
    listener.close()
    gc.collect()
    assert _fd_count() <= fds + 2  # no duplicated descriptors left open (a few for the test's own sockets)


class _Overrun:
    """A tensor of a drafter shape over a storage far too small (torch's own error was a 500 with C++ text)."""

    def __init__(self, shape):
        self.shape = tuple(shape)

    def __reduce__(self):
        from collections import OrderedDict

        strides = tuple(int(torch.tensor(self.shape[i + 1:]).prod()) for i in range(len(self.shape)))
        return (torch._utils._rebuild_tensor_v2, (torch.zeros(2).storage(), 0, self.shape, strides, False,
                                                  OrderedDict()))


def test_malformed_input_is_a_4xx_naming_the_field_never_a_500_or_a_traceback(server, folders, capfd):
    name, t = drafter_swap.drafter_tensors(folders["other"], "builtin")[0]
    _refused(*_update(server, _b64(pickle.dumps([(name, _Overrun(t.shape))], protocol=4))), "past the end")
    bad_entries = [b"", b"\x80\x04", b"not a pickle at all", b"\x80\x04K\x01.", b"\x80\x04]\x94(\x8c\x01a\x94e.",
                   pickle.dumps([("fc.weight", 1.5)], protocol=4), pickle.dumps({"a": 1}, protocol=4),
                   pickle.dumps([("fc.weight", torch.zeros(3))], protocol=4)[:-7]]
    for raw in bad_entries:
        _refused(*_update(server, _b64(raw)))
    _refused(*_update(server, "%%% not base64 %%%"), "base64")
    _refused(*_update(server, 12), "base64 string")
    out, err = capfd.readouterr()
    assert "Traceback" not in err + out


def test_a_409d_update_is_retried_with_the_same_body_after_the_sender_dropped_its_tensors(server, folders):
    def body():  # the sender's tensors die with this frame: the body alone must carry the swap
        named = drafter_swap.drafter_tensors(folders["other"], "builtin")
        return drafter_swap.update_body(named, in_band=True)

    upd = body()
    gc.collect()
    stream_req = {"text": "hello", "stream": True,
                  "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}}
    from draftlab import http_client
    assert call(server + "/begin_weight_update", {"selector": "draft"})[0] == 200
    try:
        with http_client.request(server + "/generate", stream_req, 60.0, check_status=False) as resp:
            assert resp.read(1)  # the first event: the request is decoding now
            status, reply = call(server + "/update_weights_from_tensor", upd)
            assert status == 409 and "retry" in reply["message"], reply
        status = 409
        for _ in range(200):  # the stream's client has gone: the server stops it at its next step
            status, reply = call(server + "/update_weights_from_tensor", upd)
            if status != 409:
                break
        assert status == 200, reply
    finally:
        call(server + "/end_weight_update", {})
    drafter_swap.compare_with_file(drafter_swap.server_checksums(server),
                                   drafter_swap.drafter_tensors(folders["other"], "builtin"), "retried")


def test_mistyped_fields_are_refused_naming_the_field(server):
    cases = [("/update_weights_from_tensor", {"flush_cache": "yes"}, "flush_cache"),
             ("/update_weights_from_tensor", {"weight_version": 3}, "weight_version"),
             ("/update_weights_from_tensor", {"abort_all_requests": 0}, "abort_all_requests"),
             ("/update_weights_from_tensor", {"serialized_named_tensors": [7]}, "serialized_named_tensors"),
             ("/weights_checker", {"skip_tensor_list": [1]}, "skip_tensor_list"),
             ("/weights_checker", {"allow_quant_error": "no"}, "allow_quant_error"),
             ("/begin_weight_update", {"selector": ["draft"]}, "selector")]
    for route, extra, field in cases:
        body = {"selector": "draft", **extra}
        if route == "/update_weights_from_tensor":
            body.setdefault("serialized_named_tensors", ["eA=="])
        status, reply = call(server + route, body)
        assert status == 400 and field in reply["message"], (route, extra, status, reply)


def test_weight_version_is_reported_where_sglang_reports_it(server, folders):
    assert call(server + "/model_info")[1]["weight_version"] == "default"
    entry = drafter_swap.update_body(drafter_swap.drafter_tensors(folders["other"], "builtin"),
                                     in_band=True)["serialized_named_tensors"][0]
    status, reply = _update(server, entry, weight_version="arm-remap-1")
    assert status == 200 and "Weight version updated to arm-remap-1" in reply["message"], reply
    assert call(server + "/model_info")[1]["weight_version"] == "arm-remap-1"
    assert call(server + "/server_info")[1]["weight_version"] == "arm-remap-1"
    gen = call(server + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})[1]
    assert gen["meta_info"]["weight_version"] == "arm-remap-1"
    # an update without a version keeps the one it had, as SGLang does
    assert _update(server, entry)[0] == 200
    assert call(server + "/model_info")[1]["weight_version"] == "arm-remap-1"


def test_the_update_body_limit_follows_the_drafter_not_the_prompt_limit(folders):
    """The payload is the drafter's bytes: its limit is the drafter's size, with a server body limit far lower."""
    with served(folders, None, max_body_bytes=4096) as url:
        sent = drafter_swap.swap(url, folders["other"], "builtin")
        assert sent["matched_tensors"] == sent["tensors_sent"] > 0
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # a body larger than the drafter
            sock.sendall(b"POST /update_weights_from_tensor HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 900000000\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_the_reader_takes_a_plain_pickle_of_any_dtype_exactly(protocol):
    """What a sender may legitimately write (pickle protocols 3-5, float, bfloat16, int and empty tensors,
    storages shared by memo) reads back bit for bit."""
    from draftlab.serving import tensor_payload

    named = [("a.weight", torch.randn(4, 3)), ("d2t", torch.arange(5)), ("n", torch.randn(3, dtype=torch.bfloat16)),
             ("t2d", torch.ones(7, dtype=torch.bool)), ("e", torch.zeros(0, 3))]
    raw = pickle.dumps([(n, t.clone()) for n, t in named], protocol=protocol)
    out = tensor_payload.read_named_tensors(raw, [tuple(t.shape) for _, t in named], len(named))
    assert [n for n, _ in out] == [n for n, _ in named]
    assert all(a.dtype == b.dtype and torch.equal(a, b) for (_, a), (_, b) in zip(named, out))
    with pytest.raises(tensor_payload.PayloadRefused, match="more tensors"):
        tensor_payload.read_named_tensors(raw, [tuple(t.shape) for _, t in named], len(named) - 1)
