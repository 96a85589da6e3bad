#!/usr/bin/python3
"""Every long option a program takes is in its --help and in its synopsis in
docs/TOOLS.md, and every option a synopsis names is taken: the options are
read from each command's getopt_long table in programs/*.c (with the
CLI_MODEL_LONG_OPTIONS and CLI_TRAIN_LONG_OPTIONS of programs/cli.h
expanded), the synopsis is the code block or first paragraph under the
command's heading (its first code span `tp-...` where the heading is
followed by a paragraph). Also the "Model options" paragraph names every model
option. Prints one line per disagreement; exit 1 if any.

Beside the options, facts the docs state that drift as the code changes:
  - `tp-ckpt --help`'s summary of each subcommand names every option the
    subcommand takes (its own --help and TOOLS.md are checked above);
  - every TP_* environment variable the libraries and programs read (a
    string literal "TP_NAME" in their sources) is named in README.md or
    docs/, and every TP_* name the docs that instruct (README.md, docs/
    but the records RELIABILITY.md, BENCHMARKS.md and GPU.md) give is one
    the sources, scripts or tests know;
  - docs/FORMAT.md's version (its title and the `format_version` of
    section 3) is the one ckpt/ckpt.h writes;
  - README.md's list of the check tier's end-to-end tests is the scripts
    whose header says `# tier: check`.

Usage: documented_options.py ROOT BIN
"""
import glob
import os
import re
import subprocess
import sys

ROOT, BIN = sys.argv[1], sys.argv[2]
OPTION = re.compile(r'\{"([a-z0-9-]+)",\s*(?:no|required|optional)_argument')

# (command, source file, the function holding its table, --help argv,
#  TOOLS.md heading, the synopsis line that starts the command's own part
#  of a block of several, whether the macro tables count)
COMMANDS = [
    ("tp-ckpt info", "tp-ckpt.c", "static int cmd_info(", ["tp-ckpt", "info"], "### info", None, True),
    ("tp-ckpt verify", "tp-ckpt.c", "static int cmd_verify(", ["tp-ckpt", "verify"], "### verify", None, True),
    ("tp-ckpt diff", "tp-ckpt.c", "static int cmd_diff(", ["tp-ckpt", "diff"], "### diff", None, True),
    ("tp-ckpt synth", "tp-ckpt.c", "static int cmd_synth(", ["tp-ckpt", "synth"], "### synth", None, True),
    ("tp-ckpt export", "tp-ckpt.c", "static int cmd_export(", ["tp-ckpt", "export"], "### export", None, True),
    ("tp-ckpt import", "tp-ckpt.c", "static int cmd_import(", ["tp-ckpt", "import"], "### import", None, True),
    ("tp-ckpt copy", "tp-ckpt.c", "static int cmd_copy(", ["tp-ckpt", "copy"], "### copy", None, True),
    ("tp-reshard", "tp-reshard.c", "int main(", ["tp-reshard"], "## tp-reshard", None, True),
    ("tp-train", "tp-train.c", "int main(", ["tp-train"], "## tp-train", r"mpirun -np N tp-train \[", True),
    ("tp-train prepare", "tp-train.c", "static int prepare(", ["tp-train", "prepare"], "## tp-train",
     r"tp-train prepare", True),
    ("tp-train eval", "tp-train.c", "static int eval_command(", ["tp-train", "eval"], "## tp-train",
     r"\[mpirun -np N\] tp-train eval", True),
    ("tp-train generate", "tp-train.c", "static int generate_command(", ["tp-train", "generate"], "## tp-train",
     r"tp-train generate", True),
    ("tp-elastic run", "elastic_run.c", "int elastic_run_main(", ["tp-elastic", "run"], "## tp-elastic",
     r"tp-elastic run", True),
    # plan takes tp-train's model options (its synopsis: "model options") and
    # a run's tp-train arguments as they are: those tables are tp-train's,
    # checked there.
    ("tp-elastic plan", "elastic_plan.c", "int elastic_plan_main(", ["tp-elastic", "plan"], "## tp-elastic",
     r"tp-elastic plan", False),
    ("tp-elastic report", "elastic_report.c", "int elastic_report_main(", ["tp-elastic", "report"], "## tp-elastic",
     r"tp-elastic report", True),
]


def macros():
    text = open(f"{ROOT}/programs/cli.h").read()
    found = {}
    for name in ("CLI_MODEL_LONG_OPTIONS", "CLI_TRAIN_LONG_OPTIONS"):
        m = re.search(r"#define " + name + r"((?:.*\\\n)*.*)", text)
        found[name] = OPTION.findall(m.group(1))
    return found


def table(source, function, use_macros, expand):
    text = open(f"{ROOT}/programs/{source}").read()
    start = text.index(function)
    start = text.index("struct option", start)
    end = text.index("{0, 0, 0, 0}", start)
    body = text[start:end]
    names = OPTION.findall(body)
    for macro, options in expand.items():
        if macro in body and use_macros:
            names += options
    return {n for n in names if n != "help"}


def synopsis(doc, heading, starts):
    lines = doc.split("\n")
    i = lines.index(heading) + 1
    while not lines[i].strip():
        i += 1
    if lines[i].startswith("```"):
        j = lines.index("```", i + 1)
        block = lines[i + 1:j]
    else:  # the paragraph's first code span that is a command: `tp-ckpt info CKPT [--json]`
        j = i
        while j < len(lines) and lines[j].strip():
            j += 1
        span = re.search(r"`(tp-[^`]*)`", "\n".join(lines[i:j]))
        if not span:
            raise SystemExit(f"{heading}: no synopsis in its first paragraph")
        block = span.group(1).split("\n")
    if starts is None:
        return "\n".join(block)
    # A block of several commands: each starts on an unindented line.
    chunks, current = [], []
    for line in block:
        if line and not line[0].isspace() and current:
            chunks.append(current)
            current = []
        current.append(line)
    chunks.append(current)
    mine = [c for c in chunks if re.match(starts, c[0])]
    if len(mine) != 1:
        raise SystemExit(f"{heading}: {len(mine)} synopsis lines start with /{starts}/")
    return "\n".join(mine[0])


def named(text, option):
    if option == "output":
        return re.search(r"(^|[^a-z0-9-])(-o|--output)($|[^a-z0-9-])", text) is not None
    return re.search(r"--" + re.escape(option) + r"($|[^a-z0-9-])", text) is not None


LIBRARIES = ["common", "kernels", "store", "ckpt", "reshard", "formats", "model", "trainer", "elastic", "programs"]
RECORDS = {"RELIABILITY.md", "BENCHMARKS.md", "GPU.md"}


def sources(folders, suffixes):
    for folder in folders:
        for path in sorted(glob.glob(f"{ROOT}/{folder}/**/*", recursive=True)):
            if path.endswith(suffixes) and os.path.isfile(path):
                yield path, open(path, errors="replace").read()


def docs(instructing_only):
    paths = [f"{ROOT}/README.md"] + sorted(glob.glob(f"{ROOT}/docs/*.md"))
    return {os.path.relpath(p, ROOT): open(p).read() for p in paths
            if not (instructing_only and os.path.basename(p) in RECORDS)}


def summary_problems(expand):
    """tp-ckpt's own --help: each subcommand's lines name its options."""
    commands = {argv[1]: (source, function) for _, source, function, argv, *_ in COMMANDS if argv[0] == "tp-ckpt"}
    helped = subprocess.run([f"{BIN}/tp-ckpt", "--help"], capture_output=True, text=True).stdout
    chunks, name = {}, None
    for line in helped.split("\n"):
        m = re.match(r"  ([a-z]+) ", line)
        if m and m.group(1) in commands:
            name = m.group(1)
        elif not line.startswith("    "):  # a subcommand's lines go on indented further
            name = None
        if name:
            chunks[name] = chunks.get(name, "") + line + "\n"
    problems = []
    for name, (source, function) in commands.items():
        if name not in chunks:
            problems.append(f"tp-ckpt --help: no line for {name}")
            continue
        for option in sorted(table(source, function, True, expand)):
            if not named(chunks[name], option):
                problems.append(f"tp-ckpt --help: {name}'s summary does not name --{option}, which it takes")
    return problems


def environment_problems():
    problems = []
    read = set()
    for path, text in sources(LIBRARIES, (".c", ".h", ".cu")):
        read |= set(re.findall(r'"(TP_[A-Z0-9_]+)"', text))
    documented = "\n".join(docs(False).values())
    for name in sorted(read):
        if not re.search(r"\b" + name + r"\b", documented):
            problems.append(f"the environment variable {name} is read (the sources) but named in no doc")
    known = "\n".join(text for _, text in sources(LIBRARIES + ["scripts", "tests", "bench"],
                                                   (".c", ".h", ".cu", ".py", ".sh", ".mjs")))
    known += open(f"{ROOT}/Makefile").read()
    for doc, text in docs(True).items():
        for name in sorted(set(re.findall(r"\b(TP_[A-Z][A-Z0-9_]+)\b", text))):
            if not re.search(r"\b" + name + r"\b", known):
                problems.append(f"{doc} names {name}, which no source, script or test knows")
    return problems


def format_version_problems():
    header = open(f"{ROOT}/ckpt/ckpt.h").read()
    major = re.search(r"#define CKPT_FORMAT_MAJOR (\d+)", header).group(1)
    minor = re.search(r"#define CKPT_FORMAT_MINOR (\d+)", header).group(1)
    doc = open(f"{ROOT}/docs/FORMAT.md").read()
    problems = []
    title = re.search(r"^# .*version (\d+)\.(\d+)", doc, re.M)
    if not title or title.groups() != (major, minor):
        problems.append(f"docs/FORMAT.md's title says version {'.'.join(title.groups()) if title else '?'}, "
                        f"ckpt/ckpt.h writes {major}.{minor}")
    row = re.search(r"\| `format_version` \|[^|]*\| `\[(\d+), (\d+)\]` for this document", doc)
    if not row or row.groups() != (major, minor):
        problems.append(f"docs/FORMAT.md section 3 gives format_version {list(row.groups()) if row else '?'}, "
                        f"ckpt/ckpt.h writes [{major}, {minor}]")
    return problems


def check_tier_problems():
    readme = open(f"{ROOT}/README.md").read()
    m = re.search(r"- `make check`.*?\n(?=- `make test`)", readme, re.S)
    listed = set(re.findall(r"`(test_[a-z0-9_]+)`", m.group(0))) if m else set()
    tiered = set()
    for path in glob.glob(f"{ROOT}/tests/*/test_*.sh"):
        if re.search(r"^#\s*tier:\s*check\s*$", open(path).read(), re.M):
            tiered.add(os.path.basename(path)[:-3])
    tiered.discard("test_layers")  # README calls it "the layering check"
    return ([f"README.md's check tier lists `{t}`, whose header does not say '# tier: check'"
             for t in sorted(listed - tiered)] +
            [f"README.md's check tier does not list `{t}` (its header says '# tier: check')"
             for t in sorted(tiered - listed)])


def main():
    doc = open(f"{ROOT}/docs/TOOLS.md").read()
    expand = macros()
    problems = []
    for command, source, function, argv, heading, starts, use_macros in COMMANDS:
        options = table(source, function, use_macros, expand)
        all_options = table(source, function, True, expand)
        helped = subprocess.run([f"{BIN}/{argv[0]}"] + argv[1:] + ["--help"], capture_output=True, text=True)
        if helped.returncode != 0:
            problems.append(f"{command} --help: exit {helped.returncode}")
        text = synopsis(doc, heading, starts)
        for option in sorted(options):
            if not named(helped.stdout, option):
                problems.append(f"{command}: --{option} is taken but not in its --help")
            if not named(text, option):
                problems.append(f"{command}: --{option} is taken but not in its synopsis in docs/TOOLS.md ({heading})")
        for option in sorted(set(re.findall(r"--([a-z][a-z0-9-]*)", text))):
            if option not in all_options and option != "help":
                problems.append(f"{command}: its synopsis in docs/TOOLS.md names --{option}, which it does not take")
    # The model options, all of them, in tp-train's "Model options".
    model = re.search(r"\*\*Model options\*\*(.*?)\n\n", doc, re.S)
    for option in expand["CLI_MODEL_LONG_OPTIONS"]:
        if not model or not named(model.group(1), option):
            problems.append(f"docs/TOOLS.md \"Model options\" does not name --{option}")
    problems += summary_problems(expand)
    problems += environment_problems()
    problems += format_version_problems()
    problems += check_tier_problems()
    for p in problems:
        print(p)
    print(f"{len(COMMANDS)} commands checked, {len(problems)} disagreements")
    return 1 if problems else 0


sys.exit(main())
