"""tools/docs_check.py: each rule on a small fabricated repository, then
the repository itself (CONTRIBUTING.md "Docs")."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_check  # noqa: E402

INDEX = '# docs\n\n| page | for |\n|---|---|\n| [wire.md](wire.md) | the wire |\n'
WIRE = ('# Wire protocol\n\n## Frame header\n\nEight bytes.\n\n'
        '## Closing: `close` and `goodbye`\n\n```sh\n# not a heading 2020-01-01\n```\n')


def make_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    base = {'docs/README.md': INDEX, 'docs/wire.md': WIRE, 'README.md': '# r\n\n## Python\n'}
    base.update(files)
    for name, text in base.items():
        if text is None:
            continue
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    subprocess.run(['git', 'init', '-q', str(tmp_path)], check=True)
    subprocess.run(['git', '-C', str(tmp_path), 'add', '-A'], check=True)
    return tmp_path


def findings(tmp_path: Path, files: dict[str, str]) -> list[str]:
    return docs_check.Checker(make_repo(tmp_path, files)).run()


def test_a_consistent_repository_has_no_findings(tmp_path):
    assert findings(tmp_path, {
        'lib/a.cpp': '// framing (docs/wire.md "Frame header"); close (docs/wire.md, "closing")\n',
        'docs/perf/raw.txt': 'x\n',
        'CHANGELOG.md': '# Changelog\n\n- issue 12: fixed\n',
        'docs/wire.md': WIRE + '\nRaw output: docs/perf/raw.txt; see [closing](#closing-close-and-goodbye)'
                               ' and [the index](README.md#docs).\n',
    }) == []


def test_a_citation_of_a_heading_the_page_lacks_is_found(tmp_path):
    found = findings(tmp_path, {'lib/a.cpp': '// (docs/wire.md "Frame trailer")\n'})
    assert found == ['lib/a.cpp:1: cites docs/wire.md "Frame trailer", which no heading or label of it holds']


def test_a_citation_of_a_missing_page_or_readme_heading_is_found(tmp_path):
    found = findings(tmp_path, {'test/t.py': '# docs/gone.md "Frames"\n# README "Codec"\n'})
    assert found == ['test/t.py:1: cites docs/gone.md, which does not exist',
                     'test/t.py:2: cites README.md "Codec", which no heading or label of it holds']


def test_a_bold_label_or_a_table_row_may_be_cited(tmp_path):
    assert findings(tmp_path, {
        'docs/wire.md': WIRE + '\n- **Fair turns.** One at a time.\n\n| rule | test |\n|---|---|\n| Bounded memory | t |\n',
        'lib/a.cpp': '// docs/wire.md "Fair turns"; docs/wire.md "Bounded memory"\n'}) == []


def test_a_date_in_a_heading_is_found_and_one_in_a_code_block_is_not(tmp_path):
    found = findings(tmp_path, {'docs/wire.md': WIRE + '\n## Entry sizes (2026-12-04)\n'})
    assert found == ['docs/wire.md:13: heading names a date (2026-12-04)']


@pytest.mark.parametrize('name', ['docs/wire.md', 'README.md', 'lib/a.cpp', 'python/x.py', 'test/BUILD.bazel'])
def test_an_issue_named_in_docs_or_code_is_found(tmp_path, name):
    text = (WIRE if name == 'docs/wire.md' else '# r\n\n## Python\n' if name == 'README.md' else '')
    found = findings(tmp_path, {name: text + 'as issue 27 asked\n'})
    assert len(found) == 1 and found[0].startswith(f'{name}:') and '"issue 27"' in found[0]


def test_a_link_to_a_missing_file_or_anchor_is_found(tmp_path):
    found = findings(tmp_path, {'docs/wire.md': WIRE + '\n[a](gone.md) [b](README.md#nowhere) [c](#frame-header)\n'
                                                       '[d](https://example.com/x.md)\n'})
    assert found == ['docs/wire.md:13: links to gone.md, which does not exist',
                     'docs/wire.md:13: links to #nowhere, which no heading of docs/README.md makes']


def test_a_repository_path_that_does_not_exist_is_found(tmp_path):
    found = findings(tmp_path, {
        'CONTRIBUTING.md': '# c\n\nRaw output in docs/perf/old_run.txt; see `include/blobpipe/gone.hpp`.\n',
        'examples/README.md': '# e\n\n`python/run.py`, `bench/entry_sizes` (a program), `lib/*.cpp`.\n',
        'examples/python/run.py': ''})
    assert found == ['CONTRIBUTING.md:3: names docs/perf/old_run.txt, which does not exist',
                     'CONTRIBUTING.md:3: names include/blobpipe/gone.hpp, which does not exist']


def test_the_index_lists_every_page_and_only_pages(tmp_path):
    found = findings(tmp_path, {'docs/ucx.md': '# UCX\n',
                                'docs/README.md': INDEX + '| [cuda.md](cuda.md) | gone |\n'})
    assert found == ['docs/README.md:6: links to cuda.md, which does not exist',
                     'docs/README.md:1: the index leaves out ucx.md',
                     'docs/README.md:1: the index lists cuda.md, which is not a page of docs/']


def test_the_repository_itself_passes():
    root = Path(docs_check.__file__).resolve().parent.parent
    if shutil.which('git') is None or not (root / '.git').exists():
        pytest.skip(f'{root} is not a git checkout (docs_check reads the files git tracks)')
    found = docs_check.Checker(root).run()
    assert found == [], '\n'.join(found)
