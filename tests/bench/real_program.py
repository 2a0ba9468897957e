"""real_program.py - allocation-bound programs nobody here wrote, run as a user
would run them, each inheriting the allocator from the runner's LD_PRELOAD.

  gxx           g++ -O1 compiling a file that includes 34 standard headers
                (a C++ project's translation unit: the front end's trees,
                strings and hash tables)
  python-parse  CPython (/usr/bin/python3) parsing and walking 400 modules
                of its standard library with ast (run with
                PYTHONMALLOC=malloc by run.py: every object through malloc)
  sqlite        sqlite3 on an in-memory database: 200,000 rows inserted,
                two indexes built, grouped, joined, updated

The program runs as a child; its wall time and CPU time (wait4) are printed
with a check value in one JSON object on the last stdout line.  A program
that is not installed is reported on stderr and exits 3 (run.py skips the
workload when the program is missing before it starts).

usage: real_program.py gxx|python-parse|sqlite
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

HEADERS = (
    "algorithm any array bitset chrono complex deque filesystem fstream functional future iomanip iostream list "
    "locale map memory numeric optional queue random regex set shared_mutex sstream stack string thread tuple "
    "unordered_map unordered_set valarray variant vector"
).split()

CXX_MAIN = r"""
int main() {
    std::map<std::string, std::vector<int>> m;
    std::unordered_map<int, std::string> u;
    std::regex re("a+b*");
    std::ostringstream os;
    for (int i = 0; i < 10; i++) {
        m[std::to_string(i)].push_back(i);
        u[i] = std::to_string(i);
        os << std::setw(4) << i;
    }
    std::variant<int, std::string> v = 3;
    std::sort(m["1"].begin(), m["1"].end());
    return std::regex_match(os.str(), re) + (int)u.size() + std::get<int>(v);
}
"""

PARSE = r"""
import ast, os
root = os.path.dirname(os.__file__)
skip = {"test", "tests", "site-packages", "dist-packages", "idlelib", "__pycache__"}
files = []
for d, subdirs, names in os.walk(root):
    subdirs[:] = sorted(s for s in subdirs if s not in skip)
    files += [os.path.join(d, n) for n in sorted(names) if n.endswith(".py")]
nodes = 0
for path in files[:400]:
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    nodes += sum(1 for _ in ast.walk(tree))
print(nodes)
"""

SQL = """
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, grp INTEGER, val REAL);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 200000)
INSERT INTO t SELECT i, printf('name-%d-%x', i, i * 7919), i % 997, (i * 31 % 1000) / 7.0 FROM c;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, val);
SELECT grp, count(*), sum(val), group_concat(substr(name, 1, 8), ',') FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 5;
SELECT count(*) FROM t a JOIN t b ON a.grp = b.grp AND b.id = a.id + 997 WHERE a.name LIKE 'name-1%';
UPDATE t SET name = upper(name) || '-' || grp WHERE id % 3 = 0;
SELECT count(DISTINCT name), max(length(name)) FROM t;
"""

# program name -> the executable it needs
NEEDS = {"gxx": "g++", "python-parse": "/usr/bin/python3", "sqlite": "sqlite3"}


def run(argv, stdin=None, cwd=None):
    """Run argv; returns (wall s, user+sys s, stdout)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                            cwd=cwd, text=True)
    out, _ = proc.communicate(stdin)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"real_program: {argv[0]} exited {proc.returncode}")
    usage = os.times()  # children's times: only this child was waited for
    return wall, usage.children_user + usage.children_system, out


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in NEEDS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(NEEDS)}")
    which = sys.argv[1]
    exe = shutil.which(NEEDS[which])
    if not exe:
        print(f"real_program: {NEEDS[which]} not installed", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="forgealloc-real-") as tmp:
        if which == "gxx":
            src = os.path.join(tmp, "headers.cc")
            with open(src, "w") as f:
                f.write("".join(f"#include <{h}>\n" for h in HEADERS) + CXX_MAIN)
            wall, cpu, _ = run([exe, "-std=c++17", "-O1", "-c", src, "-o", os.path.join(tmp, "headers.o")])
            check = os.path.getsize(os.path.join(tmp, "headers.o"))
        elif which == "python-parse":
            wall, cpu, out = run([exe, "-c", PARSE])
            check = int(out.split()[-1])
        else:
            wall, cpu, out = run([exe, ":memory:"], stdin=SQL)
            check = len(out)
    print(f'{{"program": "{which}", "program_s": {wall:.4f}, "program_cpu_s": {cpu:.4f}, "check": {check}}}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
