#!/usr/bin/env python3
"""check_docs.py - the documentation agrees with itself and with the code.

  every relative link and image in README.md, CHANGELOG.md, docs/*.md and tests/bench/README.md names a file that
  exists, and every #anchor a heading of that file;
  each figure of the README's opening list and of its "Performance at a glance" stands in docs/performance.md, the
  one page that holds benchmark figures;
  the README's short settings table gives each setting its default from src/core/options.def, and docs/settings.md
  has a "### FORGEALLOC_..." entry with a "Suggested:" line for every setting there;
  docs/stats.md holds the key tables src/stats/snapshot.h makes (print them with --stats-tables).

Exits 1 with one line per problem (ctest: docs.check).  The settings table of docs/settings.md is checked against
`forgealloc env --markdown` by the launcher test env, which needs the built launcher."""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent
OPTIONS_DEF = SRC / "src" / "core" / "options.def"
SNAPSHOT_H = SRC / "src" / "stats" / "snapshot.h"
STATS_BEGIN = "<!-- BEGIN stats tables: python3 tests/check_docs.py --stats-tables -->"
STATS_END = "<!-- END stats tables -->"


def doc_files():
    return [SRC / "README.md", SRC / "CHANGELOG.md", SRC / "tests" / "bench" / "README.md"] + \
        sorted((SRC / "docs").glob("*.md"))


def prose(text):
    """The text without fenced code blocks (their lines become blank, so line numbers hold)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"\s*(```+|~~~+)", line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading: formatting and punctuation dropped, lower case, blanks as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", prose(path.read_text()), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def check_links(problems):
    for path in doc_files():
        if not path.exists():
            problems.append(f"{path.relative_to(SRC)}: missing")
            continue
        text = prose(path.read_text())
        text = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)  # inline code is no link
        for m in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)", text):
            target = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path.relative_to(SRC)}:{line}"
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{where}: link to {target}: no such file")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: link to {target}: no heading with that anchor in "
                                f"{dest.relative_to(SRC)}")


def section(text, title):
    """The text under a level-2 heading, up to the next one."""
    m = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return m.group(1) if m else None


def plain_numbers(text):
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)


FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:\s*(ms/step|Mops/s|ms|us|ns|s|MB|GB|MiB|GiB|KiB|x)(?![\w]))?")


def check_figures(problems):
    readme = prose((SRC / "README.md").read_text())
    perf = plain_numbers(prose((SRC / "docs" / "performance.md").read_text()))
    opening = readme.split("\n## ", 1)[0]
    glance = section(readme, "Performance at a glance")
    if glance is None:
        problems.append("README.md: no '## Performance at a glance' section")
        return
    for name, part in (("the opening list", opening), ("Performance at a glance", glance)):
        part = plain_numbers(re.sub(r"!?\[[^\]]*\]\([^)]*\)", "", part))  # link targets hold no figures
        for m in FIGURE.finditer(part):
            number, unit = m.group(1), m.group(2)
            pattern = rf"(?<![\w.]){re.escape(number)}" + (rf"\s*{re.escape(unit)}(?!\w)" if unit else r"(?![\d])")
            if not re.search(pattern, perf):
                problems.append(f"README.md ({name}): the figure '{m.group(0).strip()}' is not in "
                                "docs/performance.md: copy figures from there, never the other way")


def options():
    """(NAME, default) of every row of options.def, in order."""
    text = OPTIONS_DEF.read_text()
    rows = re.findall(r'^FA_OPTION\((\w+),\s*\w+,\s*"([^"]*)"', text, re.M)
    if len(rows) < 10:
        raise RuntimeError(f"{OPTIONS_DEF}: FA_OPTION rows not understood ({len(rows)} found)")
    return [(f"FORGEALLOC_{name}", default) for name, default in rows]


def check_settings(problems):
    defaults = dict(options())
    table = section((SRC / "README.md").read_text(), "Settings") or ""
    rows = re.findall(r"^\|\s*`(FORGEALLOC_\w+)`\s*\|\s*`([^`]*)`\s*\|", table, re.M)
    if not rows:
        problems.append("README.md: no settings table under '## Settings'")
    for name, shown in rows:
        if name not in defaults:
            problems.append(f"README.md settings table: {name} is no setting of src/core/options.def")
        elif shown != (defaults[name] or "(unset)"):
            problems.append(f"README.md settings table: {name} default `{shown}`, options.def says "
                            f"`{defaults[name] or '(unset)'}`")
    settings = prose((SRC / "docs" / "settings.md").read_text())
    tuning = section(settings, "Tuning")
    if tuning is None:
        problems.append("docs/settings.md: no '## Tuning' section")
        return
    entries = dict(re.findall(r"^### (FORGEALLOC_\w+)\s*$(.*?)(?=^### |\Z)", tuning, re.M | re.S))
    for name, _ in options():
        if name not in entries:
            problems.append(f"docs/settings.md: no '### {name}' entry under Tuning (what it trades, and a "
                            "'Suggested:' line)")
        elif "Suggested:" not in entries[name]:
            problems.append(f"docs/settings.md: the {name} entry has no 'Suggested:' line")
    for name in entries:
        if name not in defaults:
            problems.append(f"docs/settings.md: '### {name}' is no setting of src/core/options.def")


# ---- the key tables of docs/stats.md, from src/stats/snapshot.h ---------------------------------------------------

def macro_body(text, name):
    m = re.search(r"^#define " + name + r"\([^)]*\)((?:.*\\\n)*.*)$", text, re.M)
    if not m:
        raise RuntimeError(f"{SNAPSHOT_H}: no #define {name}")
    return m.group(1).replace("\\\n", " ")


def calls(body, callee):
    """The argument lists of each top-level callee(...) in body, each argument as written."""
    out, i = [], 0
    while True:
        i = body.find(callee + "(", i)
        if i < 0:
            return out
        i += len(callee) + 1
        args, depth, start, quote = [], 0, i, False
        while True:
            c = body[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == '"':
                    quote = False
            elif c == '"':
                quote = True
            elif c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    args.append(body[start:i].strip())
                    break
                depth -= 1
            elif c == "," and depth == 0:
                args.append(body[start:i].strip())
                start = i + 1
            i += 1
        out.append(args)


def c_string(arg):
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', arg)).replace('\\"', '"')


def stats_tables():
    text = SNAPSHOT_H.read_text()
    kinds = {"FA_COUNTER": "counter", "FA_GAUGE": "gauge", "FA_FLAG": "true/false"}
    reasons = [(a[0], c_string(a[1])) for a in calls(macro_body(text, "FA_RELEASE_REASONS"), "X")]
    host = macro_body(text, "FA_HOST_FIELDS")
    rows = []
    for part in re.split(r"(FA_RELEASE_REASONS\(FA_HOST_RELEASE_ROW, X\))", host):
        if part.startswith("FA_RELEASE_REASONS"):
            rows += [(f"release.{r}_bytes", "counter", f"forgealloc_host_release_{r}_bytes_total", doc)
                     for r, doc in reasons]
            continue
        for a in calls(part, "X"):
            key, kind, metric, doc = c_string(a[0]), a[1], a[2], c_string(a[5])
            prom = "forgealloc_host_" + key.replace(".", "_") + ("_total" if kind == "FA_COUNTER" else "")
            rows.append((key, kinds[kind], prom if metric == "FA_METRIC" else "", doc))
    if len(rows) < 10 or not reasons:
        raise RuntimeError(f"{SNAPSHOT_H}: FA_HOST_FIELDS not understood ({len(rows)} rows)")
    out = ["| JSON key | kind | Prometheus | meaning |", "|---|---|---|---|"]
    out += [f"| `host.{k}` | {kind} | {f'`{p}`' if p else '-'} | {doc} |" for k, kind, p, doc in rows]
    out += ["", "| JSON key | tcmalloc property (Prometheus: `forgealloc_tcmalloc_<key>`) |", "|---|---|"]
    out += [f"| `host.tcmalloc.{a[0]}` | `{c_string(a[1])}` |" for a in calls(macro_body(text, "FA_TCMALLOC_PROPS"), "X")]
    out += ["", "| `device.devices[]` key (Prometheus: `forgealloc_device_<key>`) | unit | meaning |", "|---|---|---|"]
    out += [f"| `{a[0]}` | {c_string(a[1])} | {c_string(a[2])} |" for a in calls(macro_body(text, "FA_DEVICE_FIELDS"), "X")]
    return "\n".join(out)


def check_stats(problems):
    text = (SRC / "docs" / "stats.md").read_text()
    m = re.search(re.escape(STATS_BEGIN) + r"\n(.*?)\n" + re.escape(STATS_END), text, re.S)
    if not m:
        problems.append(f"docs/stats.md: the markers {STATS_BEGIN!r} ... {STATS_END!r} are missing")
    elif m.group(1).strip() != stats_tables().strip():
        problems.append("docs/stats.md: the key tables differ from src/stats/snapshot.h; replace the text between "
                        "the markers with the output of `python3 tests/check_docs.py --stats-tables`")


def main(argv):
    if argv[1:] == ["--stats-tables"]:
        print(stats_tables())
        return 0
    if argv[1:]:
        print("usage: check_docs.py [--stats-tables]", file=sys.stderr)
        return 2
    problems = []
    for check in (check_links, check_figures, check_settings, check_stats):
        check(problems)
    for p in problems:
        print(p)
    if not problems:
        print(f"docs: {len(doc_files())} files, links, figures, settings and stats keys agree")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
