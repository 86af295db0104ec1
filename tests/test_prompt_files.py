"""Prompt files users bring, in their own formats (issue 22): one reader (draftlab.formats.prompt_file) for
data generation and the benchmark, the benchmark's stratified ``limit`` and the category of every row.

Each format is a small real file written here the way its project ships it: MT-Bench's
``question.jsonl``, HumanEval's gzipped ``HumanEval.jsonl.gz``, GSM8K's ``test.jsonl``, ShareGPT,
OpenAI messages and plain lines.
"""

from __future__ import annotations

import collections
import gzip
import json

import pytest
from test_bench import ScriptedServer

from draftlab.benchmark.bench import Prompt, load_prompts, run_benchmark, stratified_sample
from draftlab.errors import DraftlabError
from draftlab.formats.prompt_file import iter_prompts

MT_BENCH = [  # the first lines of FastChat's data/mt_bench/question.jsonl (two categories)
    {"question_id": 81, "category": "writing", "turns": [
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
        "and must-see attractions.",
        "Rewrite your previous response. Start every sentence with the letter A."]},
    {"question_id": 82, "category": "writing", "turns": [
        "Draft a professional email seeking your supervisor's feedback on the 'Quarterly Financial Report' you "
        "prepared. Ask specifically about the data analysis, presentation style, and the clarity of conclusions "
        "drawn. Keep the email short and to the point.",
        "Take a moment to evaluate and critique your own response."]},
    {"question_id": 111, "category": "math", "turns": [
        "The vertices of a triangle are at points (0, 0), (-1, 1), and (3, 3). What is the area of the triangle?",
        "What's area of the circle circumscribing the triangle?"]},
]
HUMAN_EVAL = [  # openai/human-eval data/HumanEval.jsonl.gz, abridged
    {"task_id": "HumanEval/0",
     "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
               "    \"\"\" Check if in given list of numbers, are any two numbers closer to each other than\n"
               "    given threshold.\n    \"\"\"\n",
     "entry_point": "has_close_elements",
     "canonical_solution": "    for idx, elem in enumerate(numbers):\n        pass\n",
     "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    pass\n"},
    {"task_id": "HumanEval/1",
     "prompt": "from typing import List\n\n\ndef separate_paren_groups(paren_string: str) -> List[str]:\n"
               "    \"\"\" Input to this function is a string containing multiple groups of nested parentheses.\n"
               "    \"\"\"\n",
     "entry_point": "separate_paren_groups", "canonical_solution": "    return []\n", "test": "def check(c): pass\n"},
]
GSM8K = [  # openai/grade-school-math test.jsonl
    {"question": "Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes "
                 "muffins for her friends every day with four. She sells the remainder at the farmers' market daily "
                 "for $2 per fresh duck egg. How much in dollars does she make every day at the farmers' market?",
     "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day "
               "at the farmer\u2019s market.\n#### 18"},
    {"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total "
                 "does it take?",
     "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 "
               "bolts of fabric\n#### 3"},
]
SHAREGPT = [
    {"id": "QWJhYvA_0", "conversations": [
        {"from": "system", "value": "You are a helpful assistant."},
        {"from": "human", "value": "Summarize the plot of Hamlet in two sentences."},
        {"from": "gpt", "value": "Prince Hamlet seeks revenge ..."},
        {"from": "human", "value": "Now in one."}]},
    {"id": "i6IyJda_0", "conversations": [{"from": "human", "value": "What is a monad?"}]},
]
OPENAI = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three primes."}]},
    {"messages": [{"role": "user", "content": "Explain TCP slow start."}, {"role": "assistant", "content": "It ..."}]},
]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _gz(path, records):
    with gzip.open(path, "wt", encoding="utf-8") as f:  # as human-eval ships it
        f.write("".join(json.dumps(r) + "\n" for r in records))
    return path


def _error(path, **kw) -> str:
    with pytest.raises(DraftlabError) as exc:
        load_prompts(path, **kw)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# --- every format -----------------------------------------------------------------------------------


def test_mt_bench_sends_the_first_turn_with_its_own_category_and_id(tmp_path):
    path = _jsonl(tmp_path / "question.jsonl", MT_BENCH)
    prompts = load_prompts(path, category="mtbench")
    assert [(p.id, p.category) for p in prompts] == [("81", "writing"), ("82", "writing"), ("111", "math")]
    assert [p.text for p in prompts] == [q["turns"][0] for q in MT_BENCH]
    # data generation reads the same file with every turn a user turn (it answers them in order)
    first = next(iter_prompts(path))
    assert [m["role"] for m in first.messages] == ["user", "user"] and first.source_id == 81
    assert first.category == "writing" and first.line == 1


def test_human_eval_is_read_gzipped_with_its_task_id(tmp_path):
    path = _gz(tmp_path / "HumanEval.jsonl.gz", HUMAN_EVAL)
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # really gzipped
    prompts = load_prompts(path, category="humaneval")
    assert [p.id for p in prompts] == ["HumanEval/0", "HumanEval/1"]
    assert [p.text for p in prompts] == [r["prompt"] for r in HUMAN_EVAL]  # newlines and indentation kept
    assert {p.category for p in prompts} == {"humaneval"}  # no category in the file: the client's name


def test_gsm8k_sends_the_question_not_the_answer(tmp_path):
    prompts = load_prompts(_jsonl(tmp_path / "test.jsonl", GSM8K), category="gsm8k")
    assert [p.id for p in prompts] == ["0", "1"]  # no id in the file: the position
    assert [p.text for p in prompts] == [r["question"] for r in GSM8K]
    assert all("####" not in p.text for p in prompts) and {p.category for p in prompts} == {"gsm8k"}


def test_sharegpt_and_openai_send_the_first_user_turn(tmp_path):
    share = load_prompts(_jsonl(tmp_path / "sharegpt.jsonl", SHAREGPT))
    assert [(p.id, p.text, p.category) for p in share] == [
        ("QWJhYvA_0", "Summarize the plot of Hamlet in two sentences.", "misc"),
        ("i6IyJda_0", "What is a monad?", "misc"),
    ]
    openai = load_prompts(_jsonl(tmp_path / "chat.jsonl", OPENAI), category="chat")
    assert [(p.id, p.text, p.category) for p in openai] == [("0", "Name three primes.", "chat"),
                                                            ("1", "Explain TCP slow start.", "chat")]


def test_plain_lines_and_a_gzipped_text_file(tmp_path):
    text = "What is 2 + 2?\n\n  Write a haiku about rain.\n"
    (tmp_path / "p.txt").write_text(text)
    with gzip.open(tmp_path / "p.txt.gz", "wt") as f:
        f.write(text)
    for name in ("p.txt", "p.txt.gz"):
        prompts = load_prompts(tmp_path / name, category="lines")
        assert [(p.id, p.text, p.category) for p in prompts] == [("0", "What is 2 + 2?", "lines"),
                                                                 ("1", "  Write a haiku about rain.", "lines")]


def test_shipped_set_has_every_category_several_times():
    prompts = load_prompts("default")
    counts = collections.Counter(p.category for p in prompts)
    assert set(counts) == {"chat", "code", "math", "reasoning", "long", "short"}
    assert min(counts.values()) >= 6
    assert all(len(p.text) > 400 for p in prompts if p.category == "long")
    assert all(len(p.text) < 80 for p in prompts if p.category == "short")


# --- bad input: one line naming the file, the line and what was expected ---------------------------------


@pytest.mark.parametrize("record, expected", [
    ({"question_id": 9, "category": "math", "turns": "What is 1+1?"},
     "key 'turns': expected a list of non-empty strings (MT-Bench user turns)"),
    ({"question_id": 9, "turns": []}, "key 'turns': expected a list of non-empty strings"),
    ({"question": "", "answer": "#### 0"}, "key 'question': expected a non-empty string"),
    ({"task_id": "HumanEval/9", "prompt": 42}, "key 'prompt': expected a non-empty string"),
    ({"id": "x", "conversations": [{"from": "human"}]}, "each turn needs 'role' and 'content' strings"),
    ({"id": "x", "conversations": [{"from": "gpt", "value": "hi"}]}, "the conversation has no user turn"),
    ({"messages": [{"role": "system", "content": "Be brief."}]}, "expected a non-empty user turn to send"),
    ({"id": "x", "answer": "42"}, "expected a key 'text' or 'prompt' (a string), 'question' (GSM8K), 'turns'"),
    ({"id": "x", "text": "hi", "category": 3}, "key 'category': expected a printable string of 1-64"),
    ({"id": "x", "text": "hi", "category": "a\x1b[31mred"}, "key 'category': expected a printable string"),
    ({"id": True, "text": "hi"}, "key 'id': expected a non-empty string or integer"),
    ({"id": "a", "text": "again"}, "key 'id': duplicate prompt id 'a'"),
])
def test_bad_record_names_file_line_and_key(tmp_path, record, expected):
    path = _jsonl(tmp_path / "question.jsonl", [{"id": "a", "text": "fine"}, record])
    msg = _error(path)
    assert msg.startswith(f"{path}:2: ") and expected in msg, msg


def test_bad_json_in_a_gzipped_file_and_a_broken_gzip(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(HUMAN_EVAL[0]) + "\n{not json\n")
    assert _error(path).startswith(f"{path}:2: not valid JSON")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a truncated download
    assert "is not a readable gzip file" in _error(path)
    path.write_text('{"task_id": "HumanEval/0", "prompt": "def f():"}\n')  # named .gz, not gzipped
    msg = _error(path)
    assert msg.startswith(f"{path}:1: ") and "is not a readable gzip file" in msg


def test_missing_and_empty_files(tmp_path):
    assert "prompt file not found" in _error(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert "no prompts" in _error(tmp_path / "empty.jsonl")


# --- limit: a stratified sample -----------------------------------------------------------------------


def _set(sizes: dict[str, int]) -> list[Prompt]:
    return [Prompt(f"{c}-{i}", c, f"{c} prompt {i}") for c, n in sizes.items() for i in range(n)]


def test_limit_is_proportional_with_one_per_category_in_file_order():
    prompts = _set({"chat": 20, "code": 10, "math": 5, "long": 3, "short": 2})
    for limit, expected in [(5, {"chat": 1, "code": 1, "math": 1, "long": 1, "short": 1}),
                            (10, {"chat": 5, "code": 2, "math": 1, "long": 1, "short": 1}),
                            # math and long both 0.5 below their share (2.5, 1.5): the first in the file wins
                            (20, {"chat": 10, "code": 5, "math": 3, "long": 1, "short": 1}),
                            (39, {"chat": 19, "code": 10, "math": 5, "long": 3, "short": 2})]:
        got = stratified_sample(prompts, limit)
        assert len(got) == limit
        assert collections.Counter(p.category for p in got) == expected, limit
        index = {p.id: i for i, p in enumerate(prompts)}
        assert [index[p.id] for p in got] == sorted(index[p.id] for p in got)  # file order kept
    # fewer slots than categories: the largest categories get them
    assert [p.category for p in stratified_sample(prompts, 2)] == ["chat", "code"]
    assert stratified_sample(prompts, 40) == prompts and stratified_sample(prompts, None) == prompts


def test_limit_sample_is_seeded_and_each_category_drawn_on_its_own():
    prompts = _set({"chat": 30, "code": 30})
    a, b = stratified_sample(prompts, 6), stratified_sample(list(prompts), 6)
    assert a == b  # the same on every call (and, seeded by strings, on every host)
    assert [p.id for p in a] != ["chat-0", "chat-1", "chat-2", "code-0", "code-1", "code-2"]  # not the first N
    assert stratified_sample(prompts, 6, seed=1) != a
    # more prompts of another category never change which chat prompts are drawn at the same count
    more = _set({"math": 30, "chat": 30, "code": 30})  # drawn first, were they one stream
    chat = lambda s: [p.id for p in s if p.category == "chat"]
    assert chat(stratified_sample(more, 9)) == chat(stratified_sample(prompts, 6))


def test_default_run_limit_covers_every_shipped_category():
    got = stratified_sample(load_prompts("default"), 8)  # config/config.yaml: bench.clients[0].limit
    assert collections.Counter(p.category for p in got) == {
        "chat": 2, "code": 2, "math": 1, "reasoning": 1, "short": 1, "long": 1}


# --- every row carries its prompt's category -------------------------------------------------------


def test_rows_carry_the_files_category_else_the_clients_name(tmp_path):
    mt = _jsonl(tmp_path / "question.jsonl", MT_BENCH)
    gsm = _jsonl(tmp_path / "test.jsonl", GSM8K)
    with ScriptedServer() as srv:
        res = run_benchmark(srv.url, mt, max_new_tokens=128, repeats=2, warmup=0, progress=False, category="mtbench")
        sent = [r["text"] for r in srv.requests if r["path"] == "/generate"]
        plain = run_benchmark(srv.url, gsm, max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False,
                              category="gsm8k")
    by_id = {str(q["question_id"]): q for q in MT_BENCH}
    assert len(res.rows) == 2 * 3 + 3  # two passes and the TTFT pass
    assert all(r["category"] == by_id[r["prompt_id"]]["category"] for r in res.rows)
    assert sorted(sent) == sorted(q["turns"][0] for q in MT_BENCH for _ in range(3))  # first turns only
    assert {r["category"] for r in plain.rows} == {"gsm8k"} and len(plain.rows) == 2
    assert res.prompt_set["categories"] == {"writing": 2, "math": 1} and res.config["category"] == "mtbench"


def test_limit_in_a_run_records_the_sample(tmp_path):
    with ScriptedServer() as srv:
        res = run_benchmark(srv.url, "default", max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False, limit=6)
    assert {r["category"] for r in res.rows} == {"chat", "code", "math", "reasoning", "short", "long"}
    assert res.prompt_set["count"] == 6 and res.prompt_set["available"] == 49
    assert res.prompt_set["sample"] == "stratified, seed 0"
    assert res.prompt_set["categories"] == {c: 1 for c in ("chat", "code", "math", "reasoning", "short", "long")}


def test_serve_bench_labels_a_files_prompts_with_the_clients_name(tmp_path):
    """The workflow's serve_bench job (a plan with clients): a GSM8K client named gsm8k gets rows of
    category gsm8k; the shipped set's client keeps the set's own categories."""
    from test_reliability_servers import _experiment, _fake_server, _plan, _serve_bench

    gsm = _jsonl(tmp_path / "test.jsonl", GSM8K)
    common = {"max_new_tokens": 8, "repeats": 1, "warmup": 0, "concurrency": 1, "ignore_eos": True}
    clients = [{"name": "gsm8k", "prompts": str(gsm), "limit": None, **common},
               {"name": "default", "prompts": None, "limit": 6, **common}]
    cfg = _experiment("sglang", clients)
    plan = _plan(tmp_path, cfg, _fake_server(tmp_path, cfg))
    proc = _serve_bench(plan)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((plan.parent / "gsm8k.json").read_text())["rows"]
    assert {r["category"] for r in rows} == {"gsm8k"} and {r["prompt_id"] for r in rows} == {"0", "1"}
    rows = json.loads((plan.parent / "default.json").read_text())["rows"]
    assert sorted({r["category"] for r in rows}) == ["chat", "code", "long", "math", "reasoning", "short"]


def test_cli_category_and_sample_seed(tmp_path, capsys):
    from draftlab.cli import main

    out = tmp_path / "b.json"
    gsm = _jsonl(tmp_path / "test.jsonl", GSM8K + [{"question": f"What is {i} + {i}?"} for i in range(6)])
    with ScriptedServer() as srv:
        code = main(["bench", "--url", srv.url, "--prompts", str(gsm), "--category", "gsm8k", "--limit", "3",
                     "--sample-seed", "7", "--repeats", "1", "--warmup", "0", "--no-ttft", "--out", str(out),
                     "--no-progress"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert {r["category"] for r in data["rows"]} == {"gsm8k"} and len(data["rows"]) == 3
    assert data["prompt_set"]["sample"] == "stratified, seed 7" and data["config"]["sample_seed"] == 7
    expected = stratified_sample(load_prompts(gsm, category="gsm8k"), 3, seed=7)
    assert [r["prompt_id"] for r in data["rows"]] == [p.id for p in expected]
