"""`queue-server policy`: print the reliability policy and run its contract verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    PolicyFile,
    Url,
    connect,
    console,
    fail,
    print_json,
    process_policy,
    table,
)

app = CLI(
    help="The operation-reliability policy: show it, verify its contract.", no_args_is_help=True
)


@app.command("show")
def show(
    from_server: Annotated[
        bool, typer.Option("--from-server", help="Print the server's GET /v1/policy instead.")
    ] = False,
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    as_json: Json = False,
    policy_file: PolicyFile = None,
) -> None:
    """Print the reliability policy: every class by every dimension. Without --from-server,
    the one this machine's processes would load (--policy FILE or QUEUE_SERVER_POLICY, else
    the built-in operation-reliability.v2), validated; its --json output is a document that
    --policy accepts, to edit into a tighter policy of one's own.

    Example: [bold]queue-server policy show --json > my-policy.json[/bold]
    """
    from queue_server.policy import load_policy

    if from_server:
        with connect(url, key, data_dir) as client:
            document = client.policy()
        policy = load_policy(document)  # the server's copy must validate too
        document.pop("loaded", None)
    else:
        policy = process_policy(policy_file)
        document = policy.as_document()
    if as_json:
        print_json(document)
        return
    table(policy.version, ["class", "dimension", "value"], policy.rows())


@app.command("verify")
def verify(
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Probe this live server's envelope instead (an admin key: --key, QUEUE_SERVER_KEY"
            " or <data-dir>/admin.key); a scratch tenant is created and deleted.",
            show_default=False,
        ),
    ] = None,
    key: Key = None,
    data_dir: DataDir = None,
    weaken_mutation: Annotated[
        bool,
        typer.Option(
            "--weaken-mutation",
            help="Verify with the cancel-after-dispatch mutation path as the real one: must fail.",
        ),
    ] = False,
    policy_file: PolicyFile = None,
    as_json: Json = False,
) -> None:
    """Check the contract from this installation: the loaded policy is total and inside the
    envelope; every cell is bound (code, test, weakening), not-applicable or declared; the
    confirmed-mutation path keeps the cancellation rule and the cancel-after-dispatch
    negative control breaks it. With --server, probe a live deployment instead: each cell
    of its envelope is asked for just above its value and must be refused, naming the
    cell. In a checkout, `make contract` proves every binding by its weakening. Exits 1 on
    any failure.

    Example: [bold]queue-server policy verify --server https://queue.example.com[/bold]
    """
    if server is not None:
        _verify_server(server, key, data_dir, as_json)
        return
    from queue_server.policy import CancelAfterDispatchMutationPath, verify_contract

    report = verify_contract(
        policy=process_policy(policy_file),
        mutation_path=CancelAfterDispatchMutationPath() if weaken_mutation else None,
    )
    if as_json:
        print_json(report.as_dict())
    else:
        console.print(
            f"cells: {report.cells_checked}: {report.bound} bound to code, a test and a"
            f" weakening; {report.not_applicable} not-applicable; {report.declared} declared only"
        )
        if report.real_path is not None:
            verdict = "keeps" if report.real_path.passed else "BREAKS"
            console.print(
                f"mutation path ({report.real_path.path}): {verdict} the cancellation rule"
            )
        control = report.negative_control
        if control is not None:
            outcome = (
                "passed: the verifier cannot detect it"
                if control.passed
                else f"failed as required ({len(control.failures)} violations detected)"
            )
            console.print(f"negative control ({control.path}): {outcome}")
            for failure in control.failures:
                console.print(f"  [dim]- {failure}[/]", markup=True)
        if report.failures:
            table(
                "contract failures",
                ["cell", "problem"],
                [(f.cell, f.message) for f in report.failures],
            )
        console.print(
            "[bold green]contract verified[/]" if report.passed else "[bold red]contract FAILED[/]"
        )
    if not report.passed:
        raise typer.Exit(code=1)


def _verify_server(url: str, key: str | None, data_dir: Path | None, as_json: bool) -> None:
    from queue_server.cli.common import EXIT_REFUSED, admin_key
    from queue_server.client.probes import probe_server

    found = admin_key(key, data_dir)
    if not found:
        fail(
            "No API key",
            "probing needs an admin key: pass --key or set QUEUE_SERVER_KEY",
            EXIT_REFUSED,
        )
    report = probe_server(url, found)
    if as_json:
        print_json(report.as_dict())
    else:
        console.print(f"server {report.server}: policy {report.version} ({report.digest[:19]})")
        table(
            "envelope probes",
            ["", "probe", "cell", "detail"],
            [("ok" if p.ok else "FAILED", p.name, p.cell, p.detail) for p in report.probes],
        )
        cleanup = "deleted" if report.cleaned_up else "NOT deleted"
        console.print(f"scratch tenant {report.tenant}: {cleanup}")
        console.print(
            "[bold green]envelope verified[/]" if report.passed else "[bold red]envelope FAILED[/]"
        )
    if not report.passed:
        raise typer.Exit(code=1)
