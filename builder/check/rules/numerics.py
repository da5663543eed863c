"""Rules on what a kernel computes and where: targets, template, dtypes, layout, schedule."""

from __future__ import annotations

from typing import Iterator

from builder.check.context import KernelContext
from builder.check.rules.registry import rule
from builder.diagnostics import Diagnostic, did_you_mean
from tilekiln.spec import BLOCKWISE_BLOCK, GLU_BLOCK, SCALED_OUTPUTS, Scalars, Scaling, Scheduler, blockwise_b_blocks


@rule("TARGET-ARCH", "every target of a config is a compile target of its pipeline")
def check_targets(ctx: KernelContext) -> Iterator[Diagnostic]:
    known = ctx.facts.target_names
    for t in ctx.entry.targets:
        if t not in known:
            close = did_you_mean(t, known)
            yield ctx.diag("TARGET-ARCH", "targets", f"target {t!r} is not a target of pipeline "
                           f"{ctx.facts.pipeline} ({ctx.facts.file} lists {', '.join(known)})",
                           (f"did you mean {close!r}? " if close else "")
                           + f"use one of {', '.join(known)}, or move the kernel to the pipeline that has {t}",
                           target=t, targets=list(known), did_you_mean=close)


@rule("TEMPLATE-SUPPORT", "a template serves the pipeline and implements the config")
def check_template(ctx: KernelContext) -> Iterator[Diagnostic]:
    if ctx.template is None:
        # Block-scaled kernels have templates of their own (TemplateSet.serving).
        cfg = ctx.entry.config
        kind = f"{'block-scaled ' if cfg.block_scale is not None else 'dense '}{cfg.family} kernels of "
        yield ctx.diag("TEMPLATE-SUPPORT", "pipeline", f"no template implements {kind}pipeline {ctx.facts.pipeline}; "
                       "the rules checked the config against its facts, but nothing can build it",
                       f"write templates/<name>.py.j2 with a manifest for pipeline {ctx.facts.pipeline}, "
                       "or keep the config out of the default catalog")
        return
    why = ctx.template.unsupported(ctx.entry.config)
    if why:
        field, reason = why
        yield ctx.diag("TEMPLATE-SUPPORT", field, f"template {ctx.template.name}: {reason}",
                       f"pick an offered value or extend the template and {ctx.template.manifest_file}",
                       template=ctx.template.name)


@rule("MMA-TARGET-KIND", "the pipeline's MMA compiles for the kind (arch-specific or family) of every target")
def check_mma_target_kind(ctx: KernelContext) -> Iterator[Diagnostic]:
    if not ctx.facts.has("mma_target_kinds"):
        return
    kinds = ctx.facts.require("mma_target_kinds")
    for name in ctx.entry.targets:
        if name in ctx.facts.target_names and ctx.facts.target(name).kind not in kinds:
            usable = [t for t in ctx.facts.target_names if ctx.facts.target(t).kind in kinds]
            yield ctx.diag("MMA-TARGET-KIND", "targets", f"target {name!r} is an '{ctx.facts.target(name).kind}' target, "
                           f"but pipeline {ctx.facts.pipeline}'s {ctx.facts.require('mma_k_bytes')}-byte-K MMA "
                           f"compiles only for {'/'.join(repr(k) for k in kinds)} targets (mma_target_kinds)",
                           f"use {', '.join(usable)}", target=name, mma_target_kinds=kinds)


def _targets_outside(ctx: KernelContext, only_on: list[tuple[int, int]]) -> Iterator[tuple[str, list]]:
    """Targets whose cubin may run on a compute capability outside ``only_on``."""
    for name in ctx.entry.targets:
        if name not in ctx.facts.target_names:
            continue
        outside = [cc for cc in ctx.facts.target(name).runs_on if cc not in only_on]
        if outside:
            yield name, outside


def _cc(ccs) -> str:
    return ", ".join(f"{m}.{n}" for m, n in ccs)


@rule("DTYPE-COMBO", "the (A, B, accumulator, C) types, and the block scale, are an MMA kind of the pipeline")
def check_dtypes(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    d, scale = cfg.dtypes, cfg.block_scale
    if scale is None:
        combos = ctx.facts.require("dtype_combos")
        match = [c for c in combos if (c.a, c.b, c.acc) == (d.a, d.b, d.acc)]
        what = f"{d.a.value} x {d.b.value} accumulating in {d.acc.value}"
        offered = ", ".join(f"{c.a.value}x{c.b.value}->{c.acc.value}" for c in combos) or "none (block-scaled only)"
    else:
        combos = ctx.facts.require("block_scale_combos")
        match = [c for c in combos if (c.a, c.b, c.acc, c.scale, c.block) ==
                 (d.a, d.b, d.acc, scale.scale, scale.block)]
        what = (f"{d.a.value} x {d.b.value} with {scale.scale.value} scales per {scale.block} elements "
                f"accumulating in {d.acc.value}")
        offered = ", ".join(f"{c.name} ({c.a.value}x{c.b.value}, {c.scale.value}/{c.block})" for c in combos) \
            or "none (no block-scaled MMA)"
    field = "block_scale" if scale is not None and any((c.a, c.b) == (d.a, d.b) for c in combos) else "dtypes"
    if not match:
        yield ctx.diag("DTYPE-COMBO", field, f"{what} is not an MMA of pipeline {ctx.facts.pipeline}",
                       f"use one of: {offered}", dtypes=[d.a, d.b, d.acc, d.c], offered=offered)
        return
    if d.c not in match[0].c:
        yield ctx.diag("DTYPE-COMBO", "dtypes", f"output type {d.c.value} is not written from {d.acc.value} "
                       f"accumulators on pipeline {ctx.facts.pipeline}",
                       f"use c: {' or '.join(x.value for x in match[0].c)}", c=d.c, acc=d.acc,
                       offered_c=list(match[0].c))


@rule("DTYPE-ARCH", "the MMA kind exists on every compute capability each target's cubin may run on")
def check_dtype_arch(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    d, scale = cfg.dtypes, cfg.block_scale
    if scale is None:
        match = [c for c in ctx.facts.require("dtype_combos") if (c.a, c.b, c.acc) == (d.a, d.b, d.acc)]
    else:
        match = [c for c in ctx.facts.require("block_scale_combos")
                 if (c.a, c.b, c.acc, c.scale, c.block) == (d.a, d.b, d.acc, scale.scale, scale.block)]
    if not match or match[0].only_on is None:
        return
    only_on = [tuple(cc) for cc in match[0].only_on]
    for name, outside in _targets_outside(ctx, only_on):
        yield ctx.diag("DTYPE-ARCH", "targets", f"this MMA kind exists only on SM {_cc(only_on)}, but an {name} "
                       f"cubin may run on SM {_cc(outside)}",
                       "drop the target (an 'f' target also runs on later minors of its family) or the dtype",
                       target=name, only_on=[list(cc) for cc in only_on], outside=[list(cc) for cc in outside])


@rule("LAYOUT-DTYPE", "operands stored MN-major use a type the MMA can read transposed")
def check_layout(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    allowed = ctx.facts.require("mn_major_dtypes")
    for name, k_major, dtype in (("A", cfg.layout.a_k_major, cfg.dtypes.a), ("B", cfg.layout.b_k_major, cfg.dtypes.b)):
        if not k_major and dtype not in allowed:
            yield ctx.diag("LAYOUT-DTYPE", "layout", f"operand {name} is MN-major but {dtype.value} operands "
                           f"must be K-major on {ctx.facts.pipeline} (transposed MMA operands: "
                           f"{', '.join(x.value for x in allowed) or 'none'})", "use layout tn for this dtype",
                           operand=name, dtype=dtype, mn_major_dtypes=[x.value for x in allowed])


@rule("SCHEDULE", "the consumer schedule exists for the pipeline's MMA instruction")
def check_schedule(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.schedule.value == "pingpong" and ctx.mma != "wgmma":
        yield ctx.diag("SCHEDULE", "schedule", f"schedule pingpong alternates consumer warpgroups of warpgroup "
                       f"MMAs; pipeline {ctx.facts.pipeline} issues {ctx.mma} MMAs from one thread into tensor "
                       "memory, where accumulator double-buffering does that job",
                       "remove schedule (tcgen05 templates overlap the epilogue with the next tile's MMAs)",
                       schedule=cfg.schedule, mma_instruction=ctx.mma)


@rule("SCHEDULER-CLC", "a cluster-launch-control scheduler is asked for only where the pipeline has it")
def check_scheduler_clc(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.scheduler is Scheduler.CLC and not ctx.facts.require("cluster_launch_control"):
        yield ctx.diag("SCHEDULER-CLC", "scheduler", f"scheduler clc cancels not-yet-launched clusters with "
                       f"clusterlaunchcontrol.try_cancel, which pipeline {ctx.facts.pipeline} lacks "
                       f"({ctx.facts.source('cluster_launch_control')})",
                       "remove scheduler (the static persistent walk), or use an sm100 or sm107 pipeline",
                       scheduler=cfg.scheduler, cluster_launch_control=False)


@rule("SWIZZLE", "the raster swizzle is a power of two")
def check_swizzle(ctx: KernelContext) -> Iterator[Diagnostic]:
    s = ctx.entry.config.swizzle
    if s & (s - 1) or s > 16:
        yield ctx.diag("SWIZZLE", "swizzle", f"swizzle {s} is not a power of two up to 16", "use 1, 2, 4, 8 or 16",
                       swizzle=s, max_swizzle=16)


@rule("BLOCKWISE", "a blockwise-scaled kernel multiplies e4m3 operands, one 128-wide scale block per tile K")
def check_blockwise(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.scaling is not Scaling.BLOCKWISE:
        return
    d, block = cfg.dtypes, BLOCKWISE_BLOCK
    # An f32 C holds split-K's partial sums (tilekiln/splitk.py): each K slice promotes its own blocks.
    if (d.a.value, d.b.value, d.acc.value) != ("e4m3", "e4m3", "f32") or d.c.value not in ("bf16", "f32"):
        yield ctx.diag("BLOCKWISE", "dtypes", f"blockwise scaling takes e4m3 x e4m3 accumulating in f32 with bf16 "
                       f"output (the DeepSeek-V3 recipe), or f32 (split-K's partial sums), not {'/'.join(d.tokens)}",
                       "use dtypes {a: e4m3, b: e4m3, acc: f32, c: bf16}", dtypes=list(d.tokens))
    if cfg.tile.k != block:
        yield ctx.diag("BLOCKWISE", "tile", f"tile K {cfg.tile.k} is not the scale block of {block}: each pipeline "
                       "stage's partial sum is promoted with one K block's scales",
                       f"use tile K {block}", tile_k=cfg.tile.k, scale_block=block)
    if not blockwise_b_blocks(cfg.tile.m, cfg.tile.n, cfg.swap_ab):
        if cfg.swap_ab:
            yield ctx.diag("BLOCKWISE", "tile", f"tile M {cfg.tile.m} of a swapped kernel runs along N and does not "
                           f"divide the scale block of {block}, so a tile's rows would take more than one B scale",
                           "use tile M 64 or 128", tile_m=cfg.tile.m, scale_block=block)
        else:
            yield ctx.diag("BLOCKWISE", "tile", f"tile N {cfg.tile.n} neither divides the scale block of {block} "
                           f"nor is a multiple of {block // 2} up to {2 * block}, so a tile's columns would not "
                           "split between at most two B scale blocks at a multiple of 64",
                           "use tile N 64, 128 or 192", tile_n=cfg.tile.n, scale_block=block)
    if cfg.layout.code != "tn":
        yield ctx.diag("BLOCKWISE", "layout", f"blockwise scaling reads A (M, K) and B (N, K) both K-major; got "
                       f"layout {cfg.layout.code}", "use layout tn", layout=cfg.layout.code)


# The outputs a bias kernel writes: the epilogue adds the bias to the scaled fp32 accumulator
# and rounds the sum once to C, which must hold a float.
_BIAS_OUTPUTS = ("bf16", "f16", "f32")


def _dense_gemm_only(ctx: KernelContext, rule_id: str, path: str, argument: str, fix: str) -> Iterator[Diagnostic]:
    """``argument`` (what the field needs, with its verb: "the residual is an argument") belongs to
    the dense gemm family's signature; a kernel of another family has no such argument."""
    family = ctx.entry.config.family
    if family != "gemm":
        yield ctx.diag(rule_id, path, f"{argument} of the dense gemm family, not {family}", fix, family=family)


def _float_result(ctx: KernelContext, rule_id: str, path: str, computed: str, **facts) -> Iterator[Diagnostic]:
    """``computed`` (a sum the epilogue forms in fp32 and rounds once to C: a bias, a residual,
    alpha and beta) needs a float C that holds it; the fix removes field ``path``."""
    c = ctx.entry.config.dtypes.c
    if c.value not in _BIAS_OUTPUTS:
        outputs = ", ".join(_BIAS_OUTPUTS)
        yield ctx.diag(rule_id, path, f"{computed}, but C is {c.value}, not a float type that holds the sum "
                       f"({outputs})", f"remove {path}, or use an output type of {outputs}", c=c,
                       outputs=list(_BIAS_OUTPUTS), **facts)


@rule("BIAS-OUTPUT", "a kernel that adds a bias writes a 16-bit float or f32 result")
def check_bias_output(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.bias.dtype is not None:
        yield from _float_result(ctx, "BIAS-OUTPUT", "bias", f"bias {cfg.bias.value} is added to the fp32 "
                                 "accumulator before it is rounded to C", bias=cfg.bias.value)


@rule("BIAS-DTYPE", "the bias is float32 or of the output's type, as a call passes it")
def check_bias_dtype(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    bias, c = cfg.bias.dtype, cfg.dtypes.c
    if bias is None or bias.value == "f32" or c.value not in _BIAS_OUTPUTS or bias == c:
        return
    yield ctx.diag("BIAS-DTYPE", "bias", f"bias {bias.value} with a {c.value} result: tilekiln.linear passes a bias "
                   f"of its result's type or float32, so no call would ever run this kernel",
                   f"use bias f32, or bias {c.value}" if c.value != "f32" else "use bias f32",
                   bias=bias, c=c)


@rule("ROWWISE", "a row-wise-scaled kernel multiplies 8-bit floats into a float result")
def check_rowwise(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.scaling is not Scaling.ROWWISE:
        return
    d = cfg.dtypes
    outputs = (*_BIAS_OUTPUTS, *SCALED_OUTPUTS)
    if not d.scaled or d.acc.value != "f32" or d.c.value not in outputs:
        yield ctx.diag("ROWWISE", "dtypes", f"row-wise scaling multiplies an 8-bit float product, accumulated in "
                       f"f32, by scale_a[m] * scale_b[n] and rounds it once to a float C; got {'/'.join(d.tokens)}",
                       "use dtypes {a: e4m3, b: e4m3, acc: f32, c: bf16} (or another 8-bit float input pair)",
                       dtypes=list(d.tokens), outputs=list(outputs))


@rule("FP8-OUTPUT", "an 8-bit float C is the scaled result of a per-tensor or row-wise fp8 gemm, ungated")
def check_fp8_output(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    d = cfg.dtypes
    if not d.scaled_output:
        return
    if not d.scaled:
        yield ctx.diag("FP8-OUTPUT", "dtypes", f"a {d.c.value} C is written through scale_result, which only a "
                       f"scaled 8-bit float call passes; got {d.a.value} x {d.b.value} inputs",
                       "use 8-bit float inputs, e.g. dtypes {a: e4m3, b: e4m3, acc: f32, c: e4m3}",
                       dtypes=list(d.tokens))
    if cfg.scaling is Scaling.BLOCKWISE:
        yield ctx.diag("FP8-OUTPUT", "scaling", f"blockwise scaling with a {d.c.value} C: a blockwise call "
                       "(scaled_gemm(scale_format='blockwise')) writes bf16 (or f32), so no call would run this kernel",
                       "use scaling: tensor or rowwise", scaling=cfg.scaling.value)
    if cfg.activation.gated:
        yield ctx.diag("FP8-OUTPUT", "activation", f"{cfg.activation.value} with a {d.c.value} C: the gated "
                       "epilogue's result (tilekiln.swiglu) has its input's type", "use a 16-bit C",
                       activation=cfg.activation.value)
    yield from _dense_gemm_only(ctx, "FP8-OUTPUT", "dtypes", f"a {d.c.value} C needs scale_result, an argument",
                                "use c: bf16 for this family")


@rule("RESIDUAL", "a kernel that adds a residual writes a float result, in the dense gemm family")
def check_residual(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.residual.value == "none":
        return
    yield from _float_result(ctx, "RESIDUAL", "residual", "the residual (of C's type) is added to the fp32 "
                             "epilogue value before it is rounded to C")
    yield from _dense_gemm_only(ctx, "RESIDUAL", "residual", "the residual is an argument",
                                "remove residual for this family")


@rule("ALPHA-BETA", "a kernel with alpha and beta is an ungated dense gemm of unscaled inputs into a float result")
def check_alpha_beta(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg = ctx.entry.config
    if cfg.scalars is Scalars.NONE:
        return
    d = cfg.dtypes
    if d.scaled or cfg.block_scale is not None:
        yield ctx.diag("ALPHA-BETA", "scalars", f"alpha and beta with {d.a.value} x {d.b.value} inputs: the calls that "
                       "pass alpha and beta (tilekiln.addmm) multiply unscaled operands, and a scaled call "
                       "(scaled_gemm) passes scales, not alpha, so no call would run this kernel",
                       "remove scalars, or use 16-bit float inputs such as dtypes {a: bf16, b: bf16, acc: f32, "
                       "c: bf16}", dtypes=list(d.tokens))
    yield from _float_result(ctx, "ALPHA-BETA", "scalars", "alpha * acc + beta * residual is computed in fp32 "
                             "and rounded once to C")
    if cfg.activation.gated:
        yield ctx.diag("ALPHA-BETA", "scalars", f"alpha and beta with {cfg.activation.value}: the gated epilogue "
                       "(tilekiln.swiglu) takes no coefficients", "remove scalars",
                       activation=cfg.activation.value)
    yield from _dense_gemm_only(ctx, "ALPHA-BETA", "scalars", "alpha and beta are arguments",
                                "remove scalars for this family")


@rule("SWIGLU", "a swiglu kernel's tile holds whole gate/up block pairs, unswapped, with no per-value operands")
def check_swiglu(ctx: KernelContext) -> Iterator[Diagnostic]:
    cfg, plan = ctx.entry.config, ctx.plan
    if not cfg.activation.gated:
        return
    pair = 2 * GLU_BLOCK
    if cfg.tile.n % pair:
        yield ctx.diag("SWIGLU", "tile", f"tile N {cfg.tile.n} is not a multiple of {pair}: B's rows interleave gate "
                       f"and up in blocks of {GLU_BLOCK} (GLU_BLOCK), and the epilogue pairs a gate block with its up "
                       "block inside one tile", f"use tile N a multiple of {pair} (128 or 256)",
                       tile_n=cfg.tile.n, glu_block=GLU_BLOCK)
    if plan.epi_n and GLU_BLOCK % plan.epi_n:
        yield ctx.diag("SWIGLU", "tile", f"the epilogue's {plan.epi_m}x{plan.epi_n} sub-tile does not divide a "
                       f"{GLU_BLOCK}-column gate block, so a stored sub-tile would mix gate and up columns",
                       f"use a tile whose epilogue sub-tile N divides {GLU_BLOCK}",
                       epi_tile=[plan.epi_m, plan.epi_n], glu_block=GLU_BLOCK)
    if cfg.swap_ab:
        yield ctx.diag("SWIGLU", "swap_ab", "swiglu pairs columns of C, which a swapped kernel stores along the MMA's "
                       "rows, where the epilogue's gate and up values are in different threads",
                       "remove swap_ab (a skinny M runs a tile of 64 rows, or the unfused GEMM)", swap_ab=True)
    if cfg.bias.dtype is not None:
        yield ctx.diag("SWIGLU", "bias", f"bias {cfg.bias.value} with swiglu: the epilogue does not add a bias "
                       "before the gate and up product (tilekiln.swiglu takes none)", "remove bias",
                       bias=cfg.bias.value)
    # The dense kernels' per-value operands run along C's columns, which the gated epilogue halves; the
    # grouped kernels' gated epilogue reads each gate and up value's own column scale.
    if cfg.scaling is Scaling.ROWWISE and cfg.family == "gemm":
        yield ctx.diag("SWIGLU", "scaling", "row-wise scales with swiglu in the dense gemm family: its epilogue "
                       "applies per-tensor scales to the gate and up values only (the grouped families' applies "
                       "row-wise ones)", "use scaling: tensor", scaling=cfg.scaling.value, family=cfg.family)
    if cfg.residual.value != "none":
        yield ctx.diag("SWIGLU", "residual", "a residual with swiglu: the gated epilogue adds none (an MLP's "
                       "residual goes with its down projection)", "remove residual", residual=cfg.residual.value)
