"""The README's examples, run against real servers, so the README cannot drift from the product.

Every fenced `console` block (`$ command` lines, each followed by what it prints) and every
`pycon` block (a doctest: `>>>` lines and their output) of the documents in `DOCUMENTS` runs
against a real server (`pipeline-server` on 127.0.0.1, a free port; `http://localhost:8000` in
the text is replaced by its address). A block runs against the default model unless the line
before it is `<!-- readme-test: model=KIND -->`, which names one of the tests' tiny models
(`tests/models.py`, `tests/retrieval_models.py`, `tests/m3_models.py`; `chunk`: the default
model with LONG_INPUTS=chunk). One server per model, all started at once for this module. `bash` and
`text` blocks (installs, deployments) are not run.

What the example shows and what the command prints compare as `outputs_match` says: numbers
within `FLOAT_TOLERANCE` when written with a decimal point (embedding values may move in the
third decimal with the compute backend), exactly otherwise (shapes, counts, token ids,
statuses); `...` stands for any text, so an elided answer checks its visible part (keys,
labels, shape); all other text must be equal.
"""

from __future__ import annotations

import doctest
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ServerProcess
from m3_models import m3_model
from retrieval_models import (
    LLM_RERANKER_KINDS,
    MULTI_VECTOR_KINDS,
    llm_reranker,
    multi_vector_model,
)

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/api.md", "docs/models.md")
EXAMPLE_URL = "http://localhost:8000"
FLOAT_TOLERANCE = 2e-2
DEFAULT_MODEL = "default"
#: Settings a model marker's server runs with (the default model in LONG_INPUTS=chunk).
MODEL_ENV = {"chunk": {"LONG_INPUTS": "chunk"}}

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*model=([\w-]+)\s*-->$")
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_ELISION_OR_NUMBER = re.compile(rf"(\s*\.\.\.\s*)|({_NUMBER})")


@dataclass(frozen=True)
class Block:
    """One runnable fenced block: `kind` is `console` or `pycon`; `line` is its fence's line."""

    document: str
    line: int
    kind: str
    model: str
    text: str

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


def read_blocks(document: str) -> list[Block]:
    """The `console` and `pycon` blocks of a Markdown file, in order, with their model marker."""
    blocks: list[Block] = []
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) in ("console", "pycon"):
            before = [line for line in lines[:i] if line.strip()]
            marker = _MARKER.match(before[-1].strip()) if before else None
            model = marker.group(1) if marker else DEFAULT_MODEL
            text = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(document, i + 1, fence.group(1), model, text))
        i = end + 1
    return blocks


def console_steps(text: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block. A command is a `$ ` line plus the
    lines it continues with a trailing backslash; its output runs to the next `$ ` line."""
    steps: list[tuple[str, list[str]]] = []
    continuing = False
    for line in text.splitlines():
        if continuing:
            command, output = steps[-1]
            steps[-1] = (command + "\n" + line, output)
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            steps.append((line[2:], []))
            continuing = line.endswith("\\")
        elif steps:
            steps[-1][1].append(line)
    return [(command, "\n".join(output).strip()) for command, output in steps]


def outputs_match(expected: str, actual: str) -> bool:
    """True when `actual` reads as `expected`: `...` matches any text (whitespace around it
    included), numbers with a decimal point or exponent match within `FLOAT_TOLERANCE`, other
    numbers exactly, and the rest of the text is equal (ends stripped)."""
    pattern, numbers = [], []
    pos = 0
    expected = expected.strip()
    for m in _ELISION_OR_NUMBER.finditer(expected):
        pattern.append(re.escape(expected[pos : m.start()]))
        if m.group(1) is not None:
            pattern.append(".*?")
        else:
            pattern.append(f"({_NUMBER})")
            numbers.append(m.group(2))
        pos = m.end()
    pattern.append(re.escape(expected[pos:]))
    found = re.fullmatch("".join(pattern), actual.strip(), re.DOTALL)
    if found is None:
        return False
    return all(_numbers_match(want, got) for want, got in zip(numbers, found.groups(), strict=True))


def _numbers_match(want: str, got: str) -> bool:
    if any(c in want for c in ".eE"):
        return abs(float(want) - float(got)) <= FLOAT_TOLERANCE
    return want == got


class _ReadmeChecker(doctest.OutputChecker):
    """doctest's comparison replaced by `outputs_match`."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return outputs_match(want, got)


def _blocks() -> list[Block]:
    return [block for document in DOCUMENTS for block in read_blocks(document)]


BLOCKS = _blocks()


# --- the comparison itself (no server) ---------------------------------------------------------


def test_outputs_match_reads_numbers_elisions_and_text() -> None:
    assert outputs_match("[[0.1032,0.0305, ...]]", "[[0.10325212,0.030578658,0.03,-0.2]]")
    assert not outputs_match("[[0.1032,0.0305, ...]]", "[[0.20325212,0.030578658,0.03]]")
    assert outputs_match("(2, 384)", "(2, 384)")
    assert not outputs_match("(2, 384)", "(2, 385)")
    assert not outputs_match("(2, 384)", "(2, 384.0)")
    assert outputs_match('[{"label":...,"score":...}]', '[{"label":"POSITIVE","score":0.4}]')
    assert not outputs_match('[{"label":...,"score":...}]', '[{"label":"POSITIVE","s":0.4}]')
    assert not outputs_match('["hello world"]', '["hello  world"]')
    assert outputs_match(
        '{"request_id":"..."}', '{"request_id":"803b2ba5a46998851f4fbe3c3ecdb213"}'
    )


def test_documents_have_runnable_examples() -> None:
    readme = [block for block in BLOCKS if block.document == "README.md"]
    assert {block.kind for block in readme} == {"console", "pycon"}
    for block in BLOCKS:
        if block.kind == "console":
            steps = console_steps(block.text)
            assert steps and all(output for _, output in steps), block.name
    # The first example a reader meets asks for an embedding, on the default model.
    first = readme[0]
    assert first.model == DEFAULT_MODEL and '"inputs"' in first.text


# --- the examples, against real servers ---------------------------------------------------------


@pytest.fixture(scope="module")
def retrieval_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The multi-vector, LLM-reranker and BGE-M3 folders the documents' examples name."""
    root = tmp_path_factory.mktemp("readme-retrieval")
    return {
        "multi-vector": multi_vector_model(root / "mv", **MULTI_VECTOR_KINDS["colbert"]),
        "llm-reranker": llm_reranker(root / "llm", **LLM_RERANKER_KINDS["chat"]),
        "bge-m3": m3_model(root / "m3"),
    }


@pytest.fixture(scope="module")
def servers(
    tiny_models: dict[str, Path],
    cross_encoder_model: Path,
    embedded_model: Path,
    retrieval_models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, ServerProcess]]:
    """One real server per model the examples name, started together, then all awaited."""
    folders = {
        DEFAULT_MODEL: embedded_model,
        "chunk": embedded_model,
        "cross-encoder": cross_encoder_model,
        **tiny_models,
        **retrieval_models,
    }
    logs = tmp_path_factory.mktemp("readme-servers")
    started: dict[str, ServerProcess] = {}
    try:
        for model in sorted({block.model for block in BLOCKS}):
            env = {"MODEL_ID": str(folders[model]), **MODEL_ENV.get(model, {})}
            started[model] = ServerProcess(env, logs / f"{model}.log")
        for server in started.values():
            server.wait_ready(timeout=600)  # several loads at once on a busy 2-core machine
        yield started
    finally:
        for server in started.values():
            server.terminate()


@pytest.fixture
def offline_client_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """InferenceClient refuses URLs while HF_HUB_OFFLINE is on in its own process (the tests
    keep it on for the servers); a user's client process does not set it."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def _run_console(block: Block, server: ServerProcess) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the console examples call it")
    host = server.url.removeprefix("http://")
    for command, expected in console_steps(block.text):
        real = command.replace(EXAMPLE_URL, server.url).replace("localhost:8000", host)
        done = subprocess.run(
            ["bash", "-c", real], capture_output=True, encoding="utf-8", timeout=60, check=False
        )
        assert done.returncode == 0, f"{block.name}: {command}\n{done.stderr}"
        assert outputs_match(expected, done.stdout), (
            f"{block.name}: {command}\nthe example shows:\n{expected}\nit prints:\n{done.stdout}"
        )


def _run_pycon(block: Block, server: ServerProcess) -> None:
    source = block.text.replace(EXAMPLE_URL, server.url)
    test = doctest.DocTestParser().get_doctest(source, {}, block.name, block.document, block.line)
    report: list[str] = []
    runner = doctest.DocTestRunner(checker=_ReadmeChecker())
    result = runner.run(test, out=report.append)
    assert result.failed == 0, "".join(report)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
@pytest.mark.usefixtures("offline_client_allowed")
@pytest.mark.timeout(900)  # the first one waits for every server's load (module fixture)
def test_example_prints_what_the_document_shows(
    block: Block, servers: dict[str, ServerProcess]
) -> None:
    server = servers[block.model]
    if block.kind == "console":
        _run_console(block, server)
    else:
        _run_pycon(block, server)


def test_readme_mentions_no_test_only_setting() -> None:
    """The user's configuration table leaves out what only the tests use."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "MODEL_LOAD_DELAY_S" not in readme
