#!/usr/bin/env python3
"""Checks that the docs are a reference the code can point into.

    tools/docs_check.py [--root DIR]

Reads the files git tracks under DIR (default: the repository holding this
file) and fails, printing each finding as ``path:line: what``, when:

- a citation ``docs/<page>.md "<text>"`` (also ``README "<text>"``,
  ``README.md "<text>"``, ``CONTRIBUTING.md "<text>"``) names text that is
  in no heading, bold label (``**Fair turns.**``) or table row's first cell
  of that page (compared case-insensitively, as a part of one, so
  ``"Fuzzing"`` finds ``## Untrusted bytes: fuzzing``), or a page that
  does not exist;
- a heading of README.md, CONTRIBUTING.md or docs/ names an issue or a
  date (``issue 27``, ``2026-12-04``);
- README.md, CONTRIBUTING.md, docs/ or any code names an issue
  (CHANGELOG.md may: it says what changed when);
- a relative markdown link ``[text](path#anchor)`` in a markdown file
  names a file that does not exist, or an anchor that no heading of it
  makes (GitHub's rule: lower case, punctuation dropped, spaces to ``-``);
- a path in the repository (under ``docs/``, ``include/``, ``lib/``,
  ``bench/``, ``tools/``, ``examples/``, ``test/``, ``python/`` or ``fuzz/``)
  named in a markdown file, with a file extension, is neither in the
  repository nor beside that file;
- docs/README.md, the index, leaves out a page of docs/ or lists one that
  is not there.

Exit status 0 when nothing is found, 1 otherwise. CONTRIBUTING.md
"Docs" states the rules; ``//tools:docs_check_test`` runs this check in
the README's test command.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

_CITATION = re.compile(
    r'(?P<page>docs/[A-Za-z0-9_]+\.md|README(?:\.md)?|CONTRIBUTING\.md)'
    r'(?:,|:)?\s*\(?"(?P<text>[A-Za-z`][^"\n]{0,119})"')
# "issue 27", "issues 26 and 27", "issue-27", "issue #27"; not "an issue".
_ISSUE = re.compile(r'\bissues?[ -]#?\d+', re.IGNORECASE)
_DATE = re.compile(r'\b20\d\d-\d\d-\d\d\b')
_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')
_LINK = re.compile(r'\[[^\]\n]*\]\((?P<target>[^)\s]+)\)')
_REPO_PATH = re.compile(r'(?<![\w/.$-])(?P<path>(?:docs|include|lib|bench|tools|examples|test|python|fuzz)'
                        r'/[A-Za-z0-9_./-]*[A-Za-z0-9_])(?![\w*<{])')
_CODE_SUFFIXES = {'.cpp', '.hpp', '.h', '.cc', '.py', '.pyi', '.bazel', '.bzl',
                  '.sh', '.txt', '.in', '.cmake', '.toml', '.cfg', '.json'}
_CODE_NAMES = {'BUILD', 'WORKSPACE', 'run', '.bazelrc'}


def tracked_files(root: Path) -> list[str]:
    out = subprocess.run(['git', '-C', str(root), 'ls-files'], check=True,
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


def prose_lines(text: str):
    """(line number, line) of each line outside fenced code."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith('```'):
            fenced = not fenced
        elif not fenced:
            yield number, line


def markdown_headings(text: str) -> list[tuple[int, str]]:
    """(line number, heading text) of each heading outside fenced code."""
    return [(number, m.group(2)) for number, line in prose_lines(text)
            if (m := _HEADING.match(line))]


def labels(text: str) -> list[str]:
    """What a citation may name on a page: its headings, its bold labels
    and the first cell of each table row, outside fenced code."""
    found = [h for _, h in markdown_headings(text)]
    for _, line in prose_lines(text):
        found += re.findall(r'\*\*([^*\n]+)\*\*', line)
        row = re.match(r'^\|([^|]+)\|', line)
        if row:
            found.append(row.group(1).strip())
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and
    '_' dropped, each space a '-'."""
    plain = re.sub(r'[`*]', '', heading).strip().lower()
    plain = re.sub(r'[^\w\- ]', '', plain)
    return plain.replace(' ', '-')


class Checker:
    def __init__(self, root: Path):
        self.root = root
        self.files = tracked_files(root)
        self.findings: list[str] = []
        self._headings: dict[str, list[str]] = {}

    def report(self, path: str, line: int, what: str) -> None:
        self.findings.append(f'{path}:{line}: {what}')

    def headings_of(self, page: str) -> list[str] | None:
        if page not in self._headings:
            file = self.root / page
            if not file.is_file():
                return None
            self._headings[page] = labels(file.read_text())
        return self._headings[page]

    def text_of(self, path: str) -> str | None:
        try:
            return (self.root / path).read_text(encoding='utf-8')
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            return None

    def run(self) -> list[str]:
        for path in self.files:
            if path.startswith('tools/docs_check'):
                continue  # this checker and its test name the patterns
            text = self.text_of(path)
            if text is None:
                continue
            self.check_citations(path, text)
            is_doc = path.endswith('.md')
            if path == 'CHANGELOG.md':
                continue
            if is_doc or self.is_code(path):
                self.check_issue_names(path, text)
            if is_doc:
                self.check_headings(path, text)
                self.check_links(path, text)
        self.check_index()
        return self.findings

    @staticmethod
    def is_code(path: str) -> bool:
        p = Path(path)
        return p.suffix in _CODE_SUFFIXES or p.name in _CODE_NAMES

    def check_citations(self, path: str, text: str) -> None:
        for number, line in enumerate(text.splitlines(), 1):
            for m in _CITATION.finditer(line):
                page = m.group('page')
                if page.startswith('README'):
                    page = 'README.md'
                cited = m.group('text').strip()
                headings = self.headings_of(page)
                if headings is None:
                    self.report(path, number, f'cites {page}, which does not exist')
                elif not any(cited.lower() in h.lower() for h in headings):
                    self.report(path, number, f'cites {page} "{cited}", which no heading or label of it holds')

    def check_issue_names(self, path: str, text: str) -> None:
        for number, line in enumerate(text.splitlines(), 1):
            m = _ISSUE.search(line)
            if m:
                self.report(path, number, f'names an issue ("{m.group(0)}"); CHANGELOG.md may, '
                            'docs and code say what is true now')

    def check_headings(self, path: str, text: str) -> None:
        for number, heading in markdown_headings(text):
            m = _DATE.search(heading)
            if m:
                self.report(path, number, f'heading names a date ({m.group(0)})')

    def check_links(self, path: str, text: str) -> None:
        base = (self.root / path).parent
        for number, line in enumerate(text.splitlines(), 1):
            for m in _LINK.finditer(line):
                target = m.group('target')
                if re.match(r'^[a-z][a-z0-9+.-]*:', target):
                    continue  # https:, mailto:, ...
                file_part, _, fragment = target.partition('#')
                file = (base / file_part).resolve() if file_part else self.root / path
                if not file.exists():
                    self.report(path, number, f'links to {file_part}, which does not exist')
                    continue
                if fragment and file.suffix == '.md':
                    anchors = {anchor(h) for _, h in markdown_headings(file.read_text())}
                    if fragment not in anchors:
                        self.report(path, number, f'links to #{fragment}, which no heading of '
                                    f'{file.relative_to(self.root.resolve())} makes')
            for m in _REPO_PATH.finditer(line):
                named = m.group('path').rstrip('.')
                if '.' not in Path(named).name:
                    continue  # a program (bench/entry_sizes) or a folder made at run time
                if not ((self.root / named).exists() or (base / named).exists()):
                    self.report(path, number, f'names {named}, which does not exist')

    def check_index(self) -> None:
        index = self.text_of('docs/README.md')
        if index is None:
            self.report('docs/README.md', 1, 'the docs index is missing')
            return
        pages = {Path(p).name for p in self.files
                 if p.startswith('docs/') and p.count('/') == 1 and p.endswith('.md')}
        pages.discard('README.md')
        listed = set(re.findall(r'\]\(([A-Za-z0-9_]+\.md)\)', index))
        for page in sorted(pages - listed):
            self.report('docs/README.md', 1, f'the index leaves out {page}')
        for page in sorted(listed - pages):
            self.report('docs/README.md', 1, f'the index lists {page}, which is not a page of docs/')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--root', type=Path, default=Path(__file__).resolve().parent.parent,
                        help='the repository to check (default: the one holding this file)')
    args = parser.parse_args(argv)
    findings = Checker(args.root).run()
    for finding in findings:
        print(finding)
    print(f'docs_check: {len(findings)} finding(s)', file=sys.stderr)
    return 1 if findings else 0


if __name__ == '__main__':
    sys.exit(main())
