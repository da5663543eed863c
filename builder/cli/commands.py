"""The ``tilekiln`` command line.

Each command parses its options, calls one builder function and maps the
outcome to an exit code: 0 success, 1 the input is invalid or a kernel
failed, 2 usage, configuration or I/O error, 101 internal error. Problems are
reported once, as text, JSON or GitHub annotations; never as a traceback,
except an internal error's under ``--debug`` (builder/cli/entry.py).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import click

from builder import __version__
from builder.compile.limits import JOB_LIMITS
from builder.compile.toolchain import ToolchainError
from builder.diagnostics import DiagnosticError, Severity, did_you_mean, has_errors, render
from builder.env import settings

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 101


class Choice(click.Choice):
    """A click choice whose error names the closest choice, as click does for mistyped options and commands."""

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            close = did_you_mean(value, self.choices)
            if close:
                exc.message += f" Did you mean {close!r}?"
            raise


FORMATS = Choice(["text", "json", "github"])


def _root(ctx_root: str | None) -> Path:
    return Path(ctx_root).resolve() if ctx_root else settings().project_root


ROOT_HELP = "project root holding catalog/ and templates/ (default: $TILEKILN_ROOT or the current directory)"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tilekiln")
@click.option("--root", type=click.Path(exists=True, file_okay=False), default=None, help=ROOT_HELP)
@click.option("--debug", is_flag=True, help="print the traceback of an internal error (or set TILEKILN_DEBUG=1)")
@click.pass_context
def main(ctx: click.Context, root: str | None, debug: bool) -> None:
    """Ahead-of-time GEMM kernel builds from a validated catalog."""
    # `debug` matters only once a command has failed: wants_traceback reads it then.
    ctx.obj = _root(root)


def wants_traceback(args: list[str]) -> bool:
    """Whether the command line ``args`` (``--debug``) or $TILEKILN_DEBUG ask for an internal error's traceback.

    builder/cli/entry.py asks after the command raised, so the group's options are
    parsed again, leniently and without running any callback.
    """
    return main.make_context("tilekiln", list(args), resilient_parsing=True).params["debug"] or settings().debug


def _root_after_command(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """``tilekiln validate --root DIR`` means ``tilekiln --root DIR validate``; both at once must agree."""
    if value is None:
        return
    before = ctx.parent.params["root"]
    if before is not None and Path(before).resolve() != Path(value).resolve():
        raise click.BadParameter(f"{value} differs from the --root {before} given before the command")
    ctx.obj = Path(value).resolve()


# The commands that read the project (catalog/, templates/) take --root after their name too.
ROOT_OPTION = click.option("--root", type=click.Path(exists=True, file_okay=False), default=None, help=ROOT_HELP,
                           expose_value=False, callback=_root_after_command)


def _report(diagnostics, fmt: str) -> None:
    """JSON and GitHub annotations go to stdout (for tools); text to stderr (for people)."""
    text = render(diagnostics, fmt)
    if fmt == "json":
        click.echo(text)
    elif text:
        click.echo(text, err=fmt == "text")


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@click.option("--explain", "explain_id", metavar="ID", default=None,
              help="print the derived values (stages, shared and tensor memory per stage, occupancy) of one kernel")
@click.option("--strict", is_flag=True, help="treat warnings as errors")
@ROOT_OPTION
@click.pass_obj
def validate(root: Path, paths: tuple[str, ...], fmt: str, explain_id: str | None, strict: bool) -> None:
    """Check catalog files against the hardware facts (default: catalog/)."""
    from builder.check.rules import summarize
    from builder.check.validate import Project, validate_project

    project = Project(root)
    catalog_dir, files = None, None
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise click.UsageError(f"{p}: no such file or directory")
        if path.is_dir():
            catalog_dir = path
        else:
            files = (files or []) + [path]
    result = validate_project(project, catalog_dir, files)
    if explain_id is not None:
        match = [k for k in result.planned if k.entry.kernel_id == explain_id]
        if not match:
            _report(result.diagnostics, fmt)
            ids = sorted(k.entry.kernel_id for k in result.planned)
            close = did_you_mean(explain_id, ids)
            known = f"did you mean {close!r}?" if close else f"e.g. {', '.join(ids[:5]) or 'none'}"
            raise click.UsageError(f"no kernel with id {explain_id!r} in the catalog ({known})")
        summary = summarize(match[0]) | {
            "problems": [d.to_json() for d in result.diagnostics if d.subject == explain_id]}
        click.echo(json.dumps(summary, indent=2))
        sys.exit(EXIT_OK)
    _report(result.diagnostics, fmt)
    failing = has_errors(result.diagnostics) or (strict and any(
        d.severity is Severity.WARNING for d in result.diagnostics))
    if fmt == "text":
        n = len(result.catalog.entries) if result.catalog else 0
        status = "invalid" if failing else "ok"
        click.echo(f"{status}: {n} kernels, {sum(d.severity is Severity.ERROR for d in result.diagnostics)} "
                   f"errors, {sum(d.severity is Severity.WARNING for d in result.diagnostics)} warnings",
                   err=True)
    sys.exit(EXIT_INVALID if failing else EXIT_OK)


@main.command()
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="write to a file instead of stdout")
@click.option("--of", "kind", type=Choice(["catalog", "settings", "facts", "template"]), default="catalog",
              show_default=True, help="catalog/gemm/*.yaml, catalog/catalog.yaml, catalog/hardware/*.yaml or "
              "templates/*.yaml")
def schema(out: str | None, kind: str) -> None:
    """Write the JSON Schema of catalog files (for editor completion and checks).

    Editors that run yaml-language-server pick it up from a modeline on the
    first line of a catalog file: ``# yaml-language-server: $schema=<path>``
    (docs/catalog.md).
    """
    from builder.load.schemas import schema_of
    from tilekiln._files import write_atomic

    text = json.dumps(schema_of(kind), indent=2) + "\n"
    if out:
        try:
            write_atomic(Path(out), text)
        except OSError as exc:
            raise click.UsageError(f"--out {out}: cannot write ({exc.strerror})") from None
    else:
        click.echo(text, nl=False)


def _parse_shard(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise click.BadParameter("use I/N, e.g. 1/4") from None
    if not 1 <= index <= count:
        raise click.BadParameter(f"shard index must be within 1..{count}, got {index}")
    return index, count


def _selection(pipeline, arch, only, shard):
    from builder.pipeline.build import Selection

    return Selection(tuple(pipeline), tuple(arch), tuple(only), _parse_shard(shard))


def _dirs(root: Path, out_dir: str | None, cache_dir: str | None) -> tuple[Path, Path]:
    cfg = settings(root)
    return (Path(out_dir).resolve() if out_dir else cfg.artifacts_dir,
            Path(cache_dir).resolve() if cache_dir else cfg.cache_dir)


OUT_OPTION = click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
                          help="output directory (default: $TILEKILN_ARTIFACTS or artifacts/)")
CACHE_OPTION = click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
                            help="cache directory (default: $TILEKILN_CACHE_DIR or artifacts/.cache)")
PARTIAL_OPTION = click.option("--allow-partial", is_flag=True,
                              help="if a kernel fails, still write a bundle of the kernels that passed")
PROGRESS_OPTION = click.option("--progress", type=Choice(["auto", "rich", "plain", "none"]), default="auto",
                               show_default=True, help="rich bar, one line per compile (CI logs), or nothing")
DIAGNOSTICS_FORMAT = click.option("--format", "fmt", type=FORMATS, default="text", show_default=True,
                                  help="format of diagnostics: an invalid catalog or shard set, failed kernels "
                                  "(json and github list them on stdout; text is the table on stderr)")


def _job_limits(seconds: float | None, memory: str | None):
    from builder.load.catalog import parse_size

    limits = JOB_LIMITS
    if seconds is not None:
        limits = dataclasses.replace(limits, seconds=seconds)
    if memory is not None:
        try:
            limits = dataclasses.replace(limits, memory_bytes=parse_size(memory))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--job-memory") from None
    return limits


def _finish(result, seconds: float, check=None, fmt: str = "text") -> None:
    """Print the outcome (``seconds``: the build's wall time) and exit: 1 if a kernel failed or the rebuild differed.

    The table goes to stderr in every format. ``json`` and ``github`` also list every diagnostic of
    the run on stdout: the catalog's warnings, each failed kernel's compile-stage diagnostic and
    the differences ``--check-reproducible`` found.
    """
    from builder.cli.report import print_outcome

    print_outcome(result, seconds)
    ok = result.ok
    if fmt != "text":
        _report([*result.diagnostics, *result.failures, *(check.diagnostics if check else ())], fmt)
    if check is not None:
        if fmt == "text":
            _report(check.diagnostics, "text")
        if check.ok and check.compared:
            click.echo(f"reproducible: {check.compared} files identical in a clean rebuild", err=True)
        elif check.ok:
            click.echo("check-reproducible: nothing to compare, this build wrote no output", err=True)
        ok = ok and check.ok
    sys.exit(EXIT_OK if ok else EXIT_INVALID)


@main.command()
@OUT_OPTION
@CACHE_OPTION
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="parallel compile workers (default: one per core, within memory)")
@click.option("--executor", default="local", show_default=True,
              help="local, ray (join or start a local Ray instance) or ray=ADDRESS")
@click.option("--job-timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help=f"kill a compile running longer than this: COMPILE-TIMEOUT (default {JOB_LIMITS.seconds:g}; "
              "local executor)")
@click.option("--job-memory", default=None, metavar="SIZE",
              help=f"kill a compile whose worker grows past this resident size, e.g. 4GB: COMPILE-MEMORY "
              f"(default {JOB_LIMITS.memory_bytes // 10**9}GB; local executor)")
@click.option("--pipeline", multiple=True, help="build only this pipeline (repeatable)")
@click.option("--arch", multiple=True, help="build only this target, e.g. sm_90a (repeatable)")
@click.option("--only", multiple=True, metavar="PATTERN", help="build only kernel ids matching (glob)")
@click.option("--shard", default=None, metavar="I/N",
              help="build the I-th of N deterministic shards into artifacts/shards/ (combine with `merge`)")
@PARTIAL_OPTION
@click.option("--check-reproducible", is_flag=True,
              help="then rebuild from an empty cache in a temporary directory and compare every artifact")
@PROGRESS_OPTION
@DIAGNOSTICS_FORMAT
@ROOT_OPTION
@click.pass_obj
def build(root: Path, out_dir, cache_dir, jobs, executor, job_timeout, job_memory, pipeline, arch, only, shard,
          allow_partial, check_reproducible, progress, fmt) -> None:
    """Validate and build the catalog into bundles under artifacts/.

    A failed kernel (a compile error, a crash, past --job-timeout or --job-memory) never stops the others;
    without --allow-partial the previous bundle stays as it was.
    """
    started = time.monotonic()
    from builder.compile.parallel import ExecutorError, default_jobs, make_executor
    from builder.pipeline.build import BuildRequest
    from builder.pipeline.build import build as run_build
    from builder.pipeline.reproduce import check_reproducible as check

    out, cache = _dirs(root, out_dir, cache_dir)
    limits = _job_limits(job_timeout, job_memory)
    try:
        request = BuildRequest(root=root, out_dir=out, cache_dir=cache,
                               executor=make_executor(executor, jobs or default_jobs(), limits),
                               selection=_selection(pipeline, arch, only, shard), allow_partial=allow_partial,
                               progress=progress)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        result = run_build(request)
        seconds = time.monotonic() - started
        checked = None
        if check_reproducible:
            if progress != "none":
                click.echo("check-reproducible: building again from an empty cache in a temporary directory",
                           err=True)
            checked = check(request, result)
    except DiagnosticError as exc:
        _report(exc.diagnostics, fmt)
        sys.exit(EXIT_INVALID)
    except (ExecutorError, ToolchainError) as exc:
        click.echo(f"tilekiln: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    _finish(result, seconds, checked, fmt)


@main.command()
@click.argument("shard_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@OUT_OPTION
@CACHE_OPTION
@PARTIAL_OPTION
@PROGRESS_OPTION
@DIAGNOSTICS_FORMAT
@ROOT_OPTION
@click.pass_obj
def merge(root: Path, shard_dirs, out_dir, cache_dir, allow_partial, progress, fmt) -> None:
    """Combine the outputs of `build --shard I/N` (all N of them) into bundles.

    SHARD_DIRS are shard directories (artifacts/shards/<bundle>/<I>-of-<N>)
    or directories above them. The bundles are byte-identical to a build on
    one machine; the shards must come from this checkout's catalog.
    """
    started = time.monotonic()
    from builder.pipeline.merge import merge as run_merge

    out, cache = _dirs(root, out_dir, cache_dir)
    try:
        result = run_merge(root, [Path(p) for p in shard_dirs], out, cache, allow_partial, progress)
    except DiagnosticError as exc:
        _report(exc.diagnostics, fmt)
        sys.exit(EXIT_INVALID)
    except ToolchainError as exc:
        click.echo(f"tilekiln: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    _finish(result, time.monotonic() - started, fmt=fmt)


@main.command(name="list")
@CACHE_OPTION
@click.option("--pipeline", multiple=True, help="only this pipeline (repeatable)")
@click.option("--arch", multiple=True, help="only this target (repeatable)")
@click.option("--only", multiple=True, metavar="PATTERN", help="only kernel ids matching (glob)")
@click.option("--shard", default=None, metavar="I/N", help="only the I-th of N shards")
@click.option("--format", "fmt", type=Choice(["text", "json"]), default="text", show_default=True)
@ROOT_OPTION
@click.pass_obj
def list_kernels(root: Path, cache_dir, pipeline, arch, only, shard, fmt) -> None:
    """Show what a build would compile and what is already cached."""
    from builder.cli.report import list_planned

    try:
        rows = list_planned(root, _dirs(root, None, cache_dir)[1], _selection(pipeline, arch, only, shard))
    except DiagnosticError as exc:
        _report(exc.diagnostics, "json" if fmt == "json" else "text")
        sys.exit(EXIT_INVALID)
    except ToolchainError as exc:
        click.echo(f"tilekiln: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        for row in rows:
            click.echo(f"{row['arch']:8s} {'cached' if row['cached'] else 'build ':6s} {row['kernel']}")
        click.echo(f"{len(rows)} kernels, {sum(r['cached'] for r in rows)} cached", err=True)


def _size_limit(root: Path, max_size: str | None) -> int:
    from builder.load.catalog import load_settings, parse_size

    if max_size is not None:
        try:
            return parse_size(max_size)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--max-size") from None
    try:
        return load_settings(root / "catalog" / "catalog.yaml", root).wheel_size_limit_bytes
    except DiagnosticError as exc:
        _report(exc.diagnostics, "text")
        raise click.UsageError("no size limit: pass --max-size, or run from a project root whose "
                               "catalog/catalog.yaml sets wheel_size_limit") from None


@main.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="dist", show_default=True,
              help="directory for the wheels")
@click.option("--max-size", default=None, metavar="SIZE",
              help="refuse a wheel larger than this, e.g. 100MB (default: wheel_size_limit in catalog/catalog.yaml)")
@ROOT_OPTION
@click.pass_obj
def package(root: Path, bundles: tuple[str, ...], out_dir: str, max_size: str | None) -> None:
    """Package bundle directories as wheels that pip installs and tilekiln.load finds."""
    from builder.cli.inspection import print_size_breakdown
    from builder.package.wheel import WheelTooLarge, package_bundle

    limit = _size_limit(root, max_size)
    for bundle in bundles:
        try:
            path, wheel = package_bundle(Path(bundle), Path(out_dir), limit)
        except WheelTooLarge as exc:
            _report(exc.diagnostics, "text")
            print_size_breakdown(exc.rows)
            sys.exit(EXIT_INVALID)
        except DiagnosticError as exc:
            _report(exc.diagnostics, "text")
            sys.exit(EXIT_INVALID)
        click.echo(f"{path}: {wheel.size:,} bytes (limit {limit:,}); requires {wheel.requires}; {wheel.tag.tag} "
                   f"(library needs glibc {wheel.tag.required[0]}.{wheel.tag.required[1]})")


@main.command()
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.option("--key", "key_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="ed25519 private key, PEM (`tilekiln keygen` or `openssl genpkey -algorithm ed25519`)")
def sign(bundle: str, key_file: str) -> None:
    """Sign a bundle: write BUNDLE/signature.json, an ed25519 signature of its manifest, which
    tilekiln.load(..., trusted_keys=...) and TILEKILN_TRUSTED_KEYS check (docs/security.md)."""
    from builder.package.sign import sign_bundle

    try:
        path, kid = sign_bundle(Path(bundle), Path(key_file))
    except DiagnosticError as exc:
        _report(exc.diagnostics, "text")
        sys.exit(EXIT_INVALID)
    click.echo(f"{path}: signed with key {kid}")


@main.command()
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="the private key's file (mode 0600); the public key goes to OUT.pub")
def keygen(out: str) -> None:
    """Make an ed25519 signing key for `tilekiln sign`: OUT (private, keep it off the machines that
    load bundles) and OUT.pub (public, for TILEKILN_TRUSTED_KEYS)."""
    from builder.package.sign import generate_key

    try:
        private, public, kid = generate_key(Path(out))
    except DiagnosticError as exc:
        _report(exc.diagnostics, "text")
        sys.exit(EXIT_INVALID)
    click.echo(f"{private}: private key {kid}\n{public}: its public key")


def _open_artifacts(fmt: str, *paths: str) -> list:
    """Each bundle directory or wheel opened; one that cannot be read is reported and exits 1."""
    from builder.package.artifact import open_artifact

    try:
        return [open_artifact(Path(p)) for p in paths]
    except DiagnosticError as exc:
        _report(exc.diagnostics, fmt)
        sys.exit(EXIT_INVALID)


@main.command(name="inspect")
@click.argument("artifact", type=click.Path(exists=True))
@click.option("--format", "fmt", type=Choice(["text", "json"]), default="text", show_default=True)
def inspect_artifact(artifact: str, fmt: str) -> None:
    """Show a bundle's or bundle wheel's kernels, integrity and provenance (exit 1 if damaged)."""
    from builder.cli.inspection import inspect_json, literal_console, print_inspect

    (found,) = _open_artifacts(fmt, artifact)
    if fmt == "json":
        click.echo(json.dumps(inspect_json(found), indent=2))
    else:
        print_inspect(found, literal_console())
    sys.exit(EXIT_INVALID if found.problem else EXIT_OK)


@main.command()
@click.argument("old", type=click.Path(exists=True))
@click.argument("new", type=click.Path(exists=True))
@click.option("--format", "fmt", type=Choice(["text", "json"]), default="text", show_default=True)
def diff(old: str, new: str, fmt: str) -> None:
    """Kernels added, removed and changed between two bundles or wheels, and the size delta."""
    from builder.cli.inspection import diff_artifacts, diff_json, literal_console, print_diff

    result = diff_artifacts(*_open_artifacts(fmt, old, new))
    if fmt == "json":
        click.echo(json.dumps(diff_json(result), indent=2))
    else:
        print_diff(result, literal_console())


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.pass_context
def tune(ctx: click.Context, bundle: str) -> None:
    """Time the candidate kernels per shape bucket on this GPU, fit the selection model to the
    card, and write the card's table into BUNDLE.

    Options after BUNDLE go to `python3 -m tilekiln.tune` (see its --help):
    --shapes, --model, --dtype, --iters, --settle-ms, --table-out, --merge.
    """
    from tilekiln.tune import main as tune_main

    tune_main([bundle, *ctx.args])


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("bundle")
@click.pass_context
def verify(ctx: click.Context, bundle: str) -> None:
    """Run every kernel of BUNDLE on this GPU against a float64 reference and record the result.

    Options after BUNDLE go to `python3 -m tilekiln.verify` (see its --help):
    --out (commit it as catalog/verification/<bundle>.json), --seed, --only, --unverified.
    """
    from tilekiln.verify import main as verify_main

    verify_main([bundle, *ctx.args])
