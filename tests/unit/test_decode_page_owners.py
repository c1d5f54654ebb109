"""A decode request's pages have two writers (issue 55): the scheduler and preemption change
`req.pages` (RequestPages, decode_node/request.py) through its methods; every other module reads
`req.page_ids`, a read-only view. Checked in the source, as the type checker cannot see it in the
modules it does not hold yet."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
WRITERS = {"decode_node/scheduler.py", "decode_node/preemption.py"}
MUTATOR = re.compile(r"\.pages\.(grant|reset|extend|take|take_all|take_spare|drop)\(")
# The old ways of writing them: assigning or growing page_ids / spare_pages on the request itself.
DIRECT = re.compile(r"\.(page_ids|spare_pages)\s*(=|\+=)[^=]|\.(page_ids|spare_pages)\.(append|extend|pop|insert|remove|clear)\("
                    r"|\.page_ids\[[^]]*\]\s*=[^=]|\.(page_ids|spare_pages),[^=]*=[^=]")


def sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "decode_node").glob("*.py"))}


def test_only_the_scheduler_and_preemption_change_a_requests_pages():
    callers = {path for path, text in sources().items() if MUTATOR.search(text)}
    assert callers == WRITERS


def test_no_module_writes_page_ids_directly():
    direct = [f"{path}: {line.strip()}" for path, text in sources().items() for line in text.splitlines()
              if DIRECT.search(line)]
    assert direct == []
