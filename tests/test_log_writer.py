"""mortal.play.log_writer: logs written on a background thread are the same files, all on disk at close; a write
error surfaces; and the agent's per-batch meta parts match Mortal's fields worked out by hand."""

import gzip
import math

import numpy as np
import pytest

from mortal.play import log_writer
from mortal.play.agent import batch_meta_parts
from mortal.play.log_writer import LogWriter, dumps, meta_json, write_log_atomic


def test_logs_written_in_the_background_are_all_there_at_close(tmp_path, monkeypatch):
    texts = {f"{i}_2024_a.json.gz": f'{{"type":"start_game","n":{i}}}\n{{"type":"end_game"}}\n' for i in range(7)}
    monkeypatch.setattr(log_writer, "MAX_PENDING", 2)  # the loop waits for the oldest beyond 2
    w = LogWriter()
    for name, text in texts.items():
        w.submit(str(tmp_path / name), text)
    w.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(texts)  # no temporary names left
    for name, text in texts.items():
        assert gzip.decompress((tmp_path / name).read_bytes()).decode() == text


def test_same_bytes_as_the_direct_write_but_the_header_time(tmp_path):
    text = '{"type":"start_game"}\n' * 1000
    write_log_atomic(str(tmp_path / "direct.json.gz"), text)
    with LogWriter() as w:
        w.submit(str(tmp_path / "thread.json.gz"), text)
    a, b = (tmp_path / "direct.json.gz").read_bytes(), (tmp_path / "thread.json.gz").read_bytes()
    # gzip header: bytes 4-7 are the time of writing; level 9 both (byte 8 = 2: best compression)
    assert a[8] == b[8] == 2 and a[:4] == b[:4] and a[9:] == b[9:]


def test_level_1_is_the_same_text_in_a_larger_file(tmp_path):
    text = "".join(f'{{"type":"dahai","actor":{i % 4},"pai":"{i % 9 + 1}m","tsumogiri":false}}\n' for i in range(3000))
    with LogWriter(1) as w:
        w.submit(str(tmp_path / "fast.json.gz"), text)
    write_log_atomic(str(tmp_path / "best.json.gz"), text)
    fast, best = (tmp_path / "fast.json.gz").read_bytes(), (tmp_path / "best.json.gz").read_bytes()
    assert (fast[8], best[8]) == (4, 2)  # gzip XFL: 4 = fastest (level 1), 2 = best (level 9)
    assert gzip.decompress(fast).decode() == text and len(fast) > len(best)


def test_a_write_error_surfaces_at_close(tmp_path):
    (tmp_path / "a_file").write_text("")
    w = LogWriter()
    w.submit(str(tmp_path / "a_file" / "x.json.gz"), "x\n")  # its folder is a file
    with pytest.raises(OSError):
        w.close()


def test_a_write_error_does_not_mask_the_loop_error(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(KeyError):
        with LogWriter() as w:
            w.submit(str(tmp_path / "a_file" / "x.json.gz"), "x\n")
            raise KeyError("the loop's own error")


def test_batch_meta_parts_by_hand():
    inf = math.inf
    q = [[0.5, -inf, -0.25] + [-inf] * 43, [-inf] * 45 + [1.0]]
    masks = [[True, False, True] + [False] * 43, [False] * 45 + [True]]
    legal_q, bits = batch_meta_parts(q, masks)
    assert legal_q == [[0.5, -0.25], [1.0]]
    assert bits == [0b101, 1 << 45]
    assert all(type(b) is int for b in bits) and all(type(v) is float for row in legal_q for v in row)
    # arrays in, the same out; float32 values stay exact
    q32 = np.array(q, dtype=np.float32)
    q32[0, 0] = np.float32(0.1)
    legal_q, bits = batch_meta_parts(q32, np.array(masks))
    assert legal_q[0] == [float(np.float32(0.1)), -0.25] and bits == [0b101, 1 << 45]
    assert batch_meta_parts([], []) == ([], [])


def test_meta_json_is_the_encoders_text():
    plain = {"q_values": [0.5, -1.25e-07, 3.0, 1e16, -0.0], "mask_bits": 5, "is_greedy": True, "shanten": -1,
             "at_furiten": False, "batch_size": 3, "eval_time_ns": 9}
    assert meta_json(plain) == ('{"q_values":[0.5,-1.25e-07,3.0,1e+16,-0.0],"mask_bits":5,"is_greedy":true,'
                                '"shanten":-1,"at_furiten":false,"batch_size":3,"eval_time_ns":9}')
    # what the hand-written path must not take: the encoder's text for each
    odd = [dict(plain, q_values=[math.inf]), dict(plain, q_values=[math.nan]), dict(plain, q_values=[True]),
           dict(plain, q_values=[np.float64(0.25)]), dict(plain, q_values=(0.5,)), dict(plain, is_greedy=1),
           dict(plain, kan_select={"q_values": [1.0]}), {"mask_bits": 5, "q_values": [0.5]}]
    for meta in odd + [plain, dict(plain, q_values=[])]:
        assert meta_json(meta) == dumps(meta)
    assert '"q_values":[Infinity]' in meta_json(odd[0]) and '"is_greedy":1' in meta_json(odd[5])
