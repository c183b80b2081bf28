"""The SQL a reviewer reads is the SQL the server runs.

`queue_server/store/sql/*.sql` hold every statement, as `-- name:` blocks; each store
module loads its file and runs the blocks by name. Every block is used and every name
asked for exists; every statement the server sends is one of the blocks (no SQL
assembled at a call site). The guarantees the holder statements share are written
verbatim in each of them, and checked here: the holder guard, the ledger insert, the
counters and the outbox rows.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from queue_server.store import sql
from queue_server.store.bootstrap import DATABASE_NAME, SERVER_ROLE
from queue_server.store.channels import KEYS_CHANNEL, POLICY_CHANNEL, READY_CHANNEL
from queue_server.store.outbox import EVENTS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "queue_server"
STORE = PACKAGE / "store"
# Not the server's statements: the SDK, the reliability policy, outbound HTTP, migrations.
NOT_SERVER = ("client", "policy", "transport", "migrations")
# Run what they are given: the statement is checked where it is chosen.
PASS_THROUGH = {("queue_server.store.sql", "fetch_one"), ("queue_server.store.sql", "fetch_all")}
RUNNERS = {"execute": 0, "fetch_one": 1, "fetch_all": 1}

# The holder's authority, checked by the statement that acts on it: the item is leased,
# to this worker, under the fence it presents, and the lease has not expired.
HOLDER_GUARD = (
    "state = 'leased' AND fence = %(fence)s AND lease_holder = %(worker)s"
    " AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s"
    " AND lease_expires_at > statement_timestamp()"
)
# The same for a batch: each lease's own fence, from the statement's `input` rows (the
# state compared as text: each row is read by its key, never a partial index of leases).
HOLDER_GUARD_MANY = (
    "w.state::text = 'leased' AND w.fence = i.fence AND w.lease_holder = %(worker)s"
    " AND coalesce(w.lease_key_id, %(key_id)s) = %(key_id)s"
    " AND w.lease_expires_at > statement_timestamp()"
)
HOLDER_STATEMENTS = {
    "heartbeat": HOLDER_GUARD,
    "complete": HOLDER_GUARD,
    "requeue": HOLDER_GUARD,
    "triage_requeue": HOLDER_GUARD,
    "triage_quarantine": HOLDER_GUARD,
    "heartbeat_many": HOLDER_GUARD_MANY,
    "complete_many": HOLDER_GUARD_MANY,
}
# Statements of transitions.sql that match a fence without being a holder's operation.
NOT_HOLDER = {
    # The server's own undo of leases it never sent: the lease cannot have expired yet,
    # and its holder never knew it.
    "release_unsent",
    # Ledger rows of a refused triage: no state change, the presented fence recorded.
    "record_triage_rejected",
}

# The one INSERT into the ledger: every transition appends its events with it.
LEDGER_INSERT = "INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)"
# Statements that change work_items without a ledger row: retention, and an operator's
# bulk delete (the queue's own ledger keeps who deleted which), delete the item with its
# ledger.
NO_LEDGER = {"purge_finished", "delete_finished"}


def _flat(text: str) -> str:
    """A statement without its comments, each run of whitespace one space."""
    lines = (
        line.split("--", 1)[0] if line.lstrip().startswith("--") else line
        for line in text.splitlines()
    )
    return re.sub(r"\s+", " ", " ".join(lines)).strip()


def _files() -> dict[str, sql.Statements]:
    return {path.stem: sql.load(path.stem) for path in sorted(sql.SQL_DIR.glob("*.sql"))}


def _admission() -> str:
    """The statement of `queue_server.admit_rows` (migration 0020), the rows of the one
    enqueue admission the REST route and `queue_server.enqueue` share: from its RETURN QUERY
    to its end."""
    text: str = importlib.import_module(ADMISSION_MIGRATION).ADMIT_ROWS
    return text[text.index("RETURN QUERY") + len("RETURN QUERY") : text.index("END\n$fn$")]


ADMISSION_MIGRATION = "queue_server.migrations.versions.0020_admission_lock_last"
# Every statement that changes an item: the blocks of transitions.sql, and the admission
# its `enqueue` block calls (a SQL function, so an application's transaction runs it too).
TRANSITIONS = {**sql.load("transitions"), "queue_server.admit_rows": _admission()}


# -- the blocks and the names the code asks for -----------------------------------------


def names_asked_for(source: str) -> tuple[str | None, set[str], list[str]]:
    """In one store module: the file it loads, the names it asks that file for, and the
    lookups whose name is not a literal (each one a finding)."""
    tree = ast.parse(source)
    loaded: dict[str, str] = {}
    for statement in tree.body:
        if (
            isinstance(statement, ast.Assign)
            and isinstance(statement.value, ast.Call)
            and getattr(statement.value.func, "id", None) == "load"
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            arg = statement.value.args[0]
            assert isinstance(arg, ast.Constant)
            loaded[statement.targets[0].id] = str(arg.value)
    assert len(loaded) <= 1, "one file per store module"
    if not loaded:
        return None, set(), []
    [(var, module)] = loaded.items()
    names: set[str] = set()
    dynamic: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == var:
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
            else:
                dynamic.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    # `_SQL` passed around whole (not subscripted) would hide which names are used.
    subscripted = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Name)
            and node.id == var
            and isinstance(node.ctx, ast.Load)
            and id(node) not in subscripted
        ):
            dynamic.append(f"{module}:{node.lineno}: {var} used without a literal name")
    return module, names, dynamic


def _store_modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(STORE.glob("*.py")) if path.stem != "__init__"}


def test_each_store_module_loads_its_own_file_and_only_literal_names() -> None:
    files = set(_files())
    loaders: dict[str, str] = {}
    for stem, path in _store_modules().items():
        module, _, dynamic = names_asked_for(path.read_text(encoding="utf-8"))
        assert dynamic == []
        if module is not None:
            assert module == stem, f"{stem}.py loads {module}.sql"
            loaders[module] = stem
    assert set(loaders) == files, "a .sql file without its store module, or the reverse"


@pytest.mark.parametrize("module", sorted(p.stem for p in sql.SQL_DIR.glob("*.sql")))
def test_every_block_is_used_and_every_name_asked_for_exists(module: str) -> None:
    source = (STORE / f"{module}.py").read_text(encoding="utf-8")
    _, asked, _ = names_asked_for(source)
    blocks = set(sql.load(module))
    assert sorted(asked - blocks) == [], f"asked of {module}.sql but not there"
    assert sorted(blocks - asked) == [], f"in {module}.sql but never run"


def test_an_unknown_name_fails_loudly() -> None:
    with pytest.raises(KeyError, match=r"transitions\.sql has no statement named 'complet'"):
        sql.load("transitions")["complet"]


def test_a_file_with_two_blocks_of_one_name_does_not_load() -> None:
    with pytest.raises(ValueError, match="two statements 'a'"):
        sql.parse("-- name: a\nSELECT 1;\n\n-- name: a\nSELECT 2;\n")


def test_the_files_are_sql_and_nothing_generated() -> None:
    for path in sorted(sql.SQL_DIR.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        assert "do not edit" not in text.lower()
        assert "generated" not in text.lower()
        # A Python fragment left in: `{name}` is never SQL here.
        assert re.search(r"\{[A-Za-z_][A-Za-z_0-9.()\"', ]*\}", text) is None, path.name
    # The statements a reviewer looks for first are there, in full.
    for name in ("acquire", "heartbeat", "complete", "complete_many", "requeue", "replay"):
        assert TRANSITIONS[name].startswith(("WITH", "--"))


def test_the_names_the_code_shares_with_the_sql_agree() -> None:
    everything = "\n".join(text for named in _files().values() for text in named.values())
    channels = set(re.findall(r"pg_notify\('([a-z_]+)'", everything))
    channels |= set(re.findall(r"^LISTEN ([a-z_]+);", everything, re.MULTILINE))
    assert channels == {READY_CHANNEL, KEYS_CHANNEL, POLICY_CHANNEL}
    create = f"CREATE DATABASE {DATABASE_NAME} OWNER {SERVER_ROLE};"
    assert sql.load("bootstrap")["create_database"] == create


# -- the guarantees the transitions share, written verbatim in each -----------------------


def missing_holder_guards(statements: dict[str, str]) -> list[str]:
    """Holder statements without their guard, and fence-matching statements not listed."""
    found = []
    for name, guard in HOLDER_STATEMENTS.items():
        if guard not in _flat(statements[name]):
            found.append(f"{name}: no holder guard")
    for name, text in statements.items():
        flat = _flat(text)
        fenced = "fence = %(fence)s" in flat or "fence = i.fence" in flat
        if fenced and name not in HOLDER_STATEMENTS and name not in NOT_HOLDER:
            found.append(f"{name}: matches a fence but is not in HOLDER_STATEMENTS")
    return found


def test_every_holder_statement_carries_the_holder_guard() -> None:
    assert missing_holder_guards(dict(TRANSITIONS)) == []


def test_a_holder_statement_without_its_guard_is_found() -> None:
    statements = dict(TRANSITIONS)
    statements["complete"] = statements["complete"].replace(
        "AND lease_expires_at > statement_timestamp()", ""
    )
    assert missing_holder_guards(statements) == ["complete: no holder guard"]


def test_every_change_to_an_item_is_ledgered_by_the_one_insert() -> None:
    writes = re.compile(r"\b(UPDATE work_items|INSERT INTO work_items|DELETE FROM work_items)\b")
    for name, text in TRANSITIONS.items():
        flat = _flat(text)
        if "INSERT INTO item_events" in flat:
            assert flat.count("INSERT INTO item_events") == flat.count(LEDGER_INSERT), name
        if writes.search(flat) and name not in NO_LEDGER:
            assert LEDGER_INSERT in flat, f"{name} changes an item without a ledger row"
    # Every state change lives in transitions.sql (a tenant's deletion takes its items).
    for module, named in _files().items():
        if module == "transitions":
            continue
        for name, text in named.items():
            flat = _flat(text)
            assert "INSERT INTO item_events" not in flat, f"{module}.{name}"
            assert not re.search(r"UPDATE work_items|INSERT INTO work_items", flat), name


def test_the_counters_are_appended_never_updated() -> None:
    """A transition's statement counts in one `counted` CTE that inserts one delta row per
    (tenant, queue) it touched: no statement updates a counter, a base or the tenant's
    row, so none grows a version chain an old snapshot keeps from being pruned; only the
    fold deletes deltas and bases, and only the view `counter_totals` reads them."""
    counting = set()
    for module, named in _files().items():
        for name, text in named.items():
            flat = _flat(text)
            assert not re.search(r"UPDATE (counter_deltas|counter_bases|tenants)\b", flat), name
            if (module, name) != ("counters", "fold"):
                reads = r"(?<!DELETE )FROM (counter_deltas|counter_bases)\b"
                assert not re.search(reads, flat), name
            if "INSERT INTO counter_deltas" not in flat:
                continue
            counting.add(name)
            assert flat.count("INSERT INTO counter_deltas") == 1, name
            assert "counted AS ( INSERT INTO counter_deltas (tenant_id, queue," in flat, name
            start = flat.index("counted AS (")
            end = re.compile(r"GROUP BY tenant_id, queue(, admission_shard)? \)").search(
                flat, start
            )
            assert end is not None, name
            assert "ON CONFLICT" not in flat[start : end.start()]
            # What enters or leaves the backlog is counted for the item's admission shard
            # (migration 0028): a release gives the room back to the shard that admitted it.
            columns = flat[start : flat.index(")", start + len("counted AS ("))]
            if "admitted" in columns or "released" in columns:
                assert "(tenant_id, queue, shard," in columns, name
                assert end.group(1), name
    assert counting == {
        "acquire",
        "acquire_rated",
        "complete",
        "complete_many",
        "triage_requeue",
        "triage_quarantine",
        "replay",
        "discard",
        "cancel",
        "purge_finished",
        "retry",
        "delete_finished",
    }


def _outbox(flat: str) -> str:
    start = flat.index("outbox AS (")
    return flat[start : flat.index("ORDER BY s.item_id, w.watcher_id )", start)]


def test_every_outbox_insert_is_the_same_but_for_its_event_and_source() -> None:
    """One outbox row per active watcher of the event for each changed row, the body the
    item as the API shapes it (`item_json`): written alike in every transition."""
    shapes = {}
    for name, text in TRANSITIONS.items():
        flat = _flat(text)
        if "INSERT INTO outbox_deliveries" not in flat:
            continue
        cte = _outbox(flat)
        events = set(re.findall(r"'(item\.[a-z]+)'", cte))
        assert len(events) == 1, name
        [event] = events
        assert event in EVENTS, name
        shape = cte.replace(event, "EVENT")
        shape = re.sub(r"FROM \w+ s JOIN watchers", "FROM SOURCE s JOIN watchers", shape)
        shapes[name] = shape
    assert len(shapes) >= 8
    assert len(set(shapes.values())) == 1, sorted(shapes)
    # The body: the item as the API shapes it, by the function of migration 0012.
    [shape] = set(shapes.values())
    assert "'occurred_at', api_timestamp(statement_timestamp()), 'item', item_json(s))" in shape
    # The API's time format lives once, in api_timestamp.
    for module, named in _files().items():
        for name, text in named.items():
            assert "to_char(" not in text, f"{module}.{name}: a time formatted by hand"
    # Every event a watcher can ask for is written by some transition.
    written = {e for t in TRANSITIONS.values() for e in re.findall(r"'(item\.[a-z]+)'", t)}
    assert written == set(EVENTS)


# -- every statement sent is a block --------------------------------------------------


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _server_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in NOT_SERVER
    ]


def _statement_arg(call: ast.Call) -> ast.expr | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    index = RUNNERS.get(name or "")
    if index is None or len(call.args) <= index:
        return None
    return call.args[index]


def _values(expr: ast.expr, module: Any, local: dict[str, ast.expr]) -> list[Any]:
    """Every value `expr` can take, resolved through the module's and the function's names."""
    if isinstance(expr, ast.IfExp):
        return _values(expr.body, module, local) + _values(expr.orelse, module, local)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
        mapping = getattr(module, expr.value.id)
        if isinstance(expr.slice, ast.Constant):
            return [mapping[expr.slice.value]]
        return list(mapping.values())
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        # A statement another store module loaded (`cursors.ADVANCE`).
        named = getattr(getattr(module, expr.value.id, None), expr.attr, None)
        if isinstance(named, str):
            return [named]
    if isinstance(expr, ast.Name):
        if expr.id in local:
            return _values(local[expr.id], module, {})
        if hasattr(module, expr.id):
            return [getattr(module, expr.id)]
    # A literal, an f-string, a concatenation, a call: SQL assembled at the call site.
    return [ast.unparse(expr)]


def unregistered_statements(path: Path, source: str | None = None) -> list[str]:
    """The statements a server module runs that are not blocks of a file, as `module:line: text`."""
    blocks = {text for named in _files().values() for text in named.values()}
    name = _module_name(path)
    module = importlib.import_module(name)
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if (name, function.name) in PASS_THROUGH:
            continue
        local = {
            node.targets[0].id: node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        }
        for call in ast.walk(function):
            if not isinstance(call, ast.Call) or (arg := _statement_arg(call)) is None:
                continue
            for value in _values(arg, module, local):
                if value not in blocks:
                    found.append(f"{name}:{call.lineno}: {str(value)[:60]}")
    return found


def test_every_statement_the_server_runs_is_a_block_of_a_file() -> None:
    found = [hit for path in _server_modules() for hit in unregistered_statements(path)]
    assert found == []


@pytest.mark.parametrize(
    "call",
    [
        'await conn.execute("SELECT 1")',
        'await conn.execute(f"SELECT {x}")',
        "await conn.execute(_SQL['get_item'] + ' FOR UPDATE')",
        'await fetch_one(conn, "SELECT 1", {})',
        "sql = 'SELECT 2'\n    await conn.execute(sql)",
    ],
)
def test_a_statement_assembled_at_the_call_site_is_found(call: str) -> None:
    path = STORE / "reads.py"
    source = path.read_text(encoding="utf-8") + f"\n\nasync def planted(conn, x):\n    {call}\n"
    assert len(unregistered_statements(path, source)) == 1


def test_a_block_with_tagged_lines_holds_a_variant_and_each_keeps_its_own_lines() -> None:
    parsed = sql.parse(
        "-- name: a\nSELECT 1  --@a\nSELECT 2  --@b\n, 3\n;\n-- name: c\nSELECT 4;\n"
    )
    assert parsed == {"a": "SELECT 1\n, 3\n;", "b": "SELECT 2\n, 3\n;", "c": "SELECT 4;"}
    with pytest.raises(ValueError, match="two statements 'c'"):
        sql.parse("-- name: a\nSELECT 1\nSELECT 3  --@c\n-- name: c\nSELECT 2;\n")
    # The rate-limited queue's acquire is the acquire's variant: the same text but its lines.
    assert "rate_grants" in TRANSITIONS["acquire_rated"]
    assert "rate_grants" not in TRANSITIONS["acquire"]


def test_psycopg_converts_each_statement_once_and_then_reads_its_cache() -> None:
    """psycopg turns a statement's `%(name)s` placeholders into `$n` once per text and
    caches that, but only for a text within its length and placeholder bounds (4 KiB by
    default); a longer one is converted again at every call: 0.1 ms of the server's CPU per
    acquire, whose text is 16 KiB. queue_server.db raises the bound; each statement of the
    files must stay within it, or the cache is lost without a sign."""
    importlib.import_module("queue_server.db")
    from psycopg import _queries

    over = []
    for path in sorted(sql.SQL_DIR.glob("*.sql")):
        for name, text in sql.load(path.stem).items():
            placeholders = set(re.findall(r"%\((\w+)\)s", text))
            if (
                len(text.encode()) > _queries.MAX_CACHED_STATEMENT_LENGTH
                or len(placeholders) > _queries.MAX_CACHED_STATEMENT_PARAMS
            ):
                over.append(f"{path.stem}.{name}: {len(text.encode())} bytes")
    assert over == []
