"""Reading user files: bytes that are not UTF-8 and a leading byte-order mark."""

import re

import pytest

from nereus.errors import InputError
from nereus.files import read_json, read_yaml
from nereus.sim import traces as T

LATIN1 = "name: caf\xe9\n".encode("latin-1")     # 0xe9 alone is not UTF-8


def test_non_utf8_json_and_yaml_are_one_line_input_errors(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_bytes(LATIN1)
    with pytest.raises(InputError, match=r"^config: .*x\.yaml is not UTF-8 text") as e:
        read_yaml(p, "config")
    assert "\n" not in str(e.value)
    p = tmp_path / "x.json"
    p.write_bytes(b'{"a": "\xff\xfe"}')
    with pytest.raises(InputError, match=r"^plan: .*x\.json is not UTF-8 text"):
        read_json(p, "plan")


def test_a_byte_order_mark_is_not_part_of_the_content(tmp_path):
    p = tmp_path / "x.json"
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}')
    assert read_json(p, "plan") == {"a": 1}
    p = tmp_path / "x.yaml"
    p.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_yaml(p, "config") == {"a": 1}


@pytest.mark.parametrize("what,load", [("availability", T.load_availability),
                                       ("lengths", T.load_lengths), ("drift", T.load_drift)])
def test_non_utf8_csv_is_a_one_line_input_error(tmp_path, what, load):
    p = tmp_path / "t.csv"
    p.write_bytes(b"a,b\n\xff\xfe,1\n" * 3)
    with pytest.raises(InputError, match=rf"^{what}: .*t\.csv is not UTF-8 text") as e:
        load(p)
    assert "\n" not in str(e.value)


def test_a_csv_with_a_byte_order_mark_keeps_its_first_column(tmp_path):
    """Excel writes UTF-8 CSV with a BOM, which would glue itself to the first header."""
    p = tmp_path / "pool.csv"
    p.write_bytes(b"\xef\xbb\xbftime_s,gpus\r\n0,16\r\n600,8\r\n")
    av = T.load_availability(p)
    assert av.times == (0.0, 600.0) and av.pools[1] == tuple(range(8))
    p = tmp_path / "len.csv"
    p.write_bytes(b"\xef\xbb\xbfstep,response_len_mean,response_len_max\n0,100,200\n")
    assert T.load_lengths(p).mean == (100.0,)


@pytest.mark.parametrize("what,load,text", [
    ("availability", T.load_availability, "time_s,gpus\n0,16\n600,8\n"),
    ("lengths", T.load_lengths, "step,response_len_mean,response_len_max\n0,1,2\n1,1,2\n"),
    ("drift", T.load_drift, "start_step,end_step,op_class,factor\n0,5,gemm,0.5\n1,2,gemm,.5\n"),
])
def test_csv_whitespace_lines_are_skipped_and_an_empty_file_says_so(tmp_path, what, load,
                                                                    text):
    """A trailing line of spaces (editors leave them) was a row with a field too few; an
    empty file was reported as lacking its first column."""
    from dataclasses import replace

    p, clean = tmp_path / "t.csv", tmp_path / "clean.csv"
    p.write_text(text + "   \n\t\n")
    clean.write_text(text)
    assert replace(load(p), source="") == replace(load(clean), source="")
    # the path as given, as "no file at ..." says it (it said the file's name alone)
    says = rf"^{what}: {re.escape(str(p))} is empty \(allowed: a header naming "
    for empty in ("", "  \n\n"):
        p.write_text(empty)
        with pytest.raises(InputError, match=says) as e:
            load(p)
        assert "lacks column" not in str(e.value)
