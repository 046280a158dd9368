"""AxoSim-Lite's P4 recurrence as one Triton launch forward and one backward, float32.

Per neuron (row) and P4 block ``b``, with the adaptation cache ``c`` split as axosim
packs it (token offset/gain, decay delta, state gain/offset, output gain/offset):

    a_b = (x_b + c.token_offset) * (1 + c.token_gain)                 adapted token (K)
    p_b = tanh(W_in a_b + W_rec s_{b-1} + state_bias + c.state_offset)   proposal (S)
    d   = sigmoid(shared_decay_logit + c.decay_delta)                  decay, constant in b
    s_b = d * s_{b-1} + (1 - d) * p_b * (1 + c.state_gain)              s_{-1} = 0
    y_b = (W_out s_b + out_bias + W_skip a_b) * (1 + c.output_gain) + c.output_offset

which is ``AdaptiveSupportP4Surrogate.step_token`` unrolled over all blocks. Neurons are
independent, so a program owns ``BLOCK_N`` of them and loops over the blocks with the state
in registers. Every per-block tensor is time-major, ``(blocks, neurons, width)``: a step's
loads and stores are contiguous across the program's neurons, and each step prefetches the
next step's inputs so their load latency overlaps the arithmetic. The forward saves each
``s_b``; the backward walks the blocks in reverse, recomputes ``a_b``, ``p_b`` and the
pre-gain output from the saved states, carries ``dL/ds_b`` in registers, accumulates the
cache gradients per neuron in registers and writes them once.

With ``LOSS`` the forward kernel also takes the targets and computes a mean pointwise error
(squared or Huber) over the steps the loss keeps: each program writes its rows' share of the
loss, and in place of the forecasts it stores the loss's gradient with respect to them, which
the backward kernel scales by the upstream gradient as it loads it. The assembled output, the
loss and their backward (about a dozen small kernels) are then not needed.

With ``FRONT`` (:func:`lite_front_recurrence`) the kernels also compute what axosim computes
before the recurrence: each block's token from the raw contact inputs of its 4 steps times the
efficacies ``exp(synaptic_log_efficacy)``, through a per-neuron matrix that is the input projection's
weight times each contact's route features (:class:`Front`), and the cache as the behaviour bank's
row plus the morphology bank's. The backward recomputes the tokens the same way, accumulates the
log-efficacies' gradient per row in registers next to the cache's, and writes both once.

The neuron's own weights are constants here: axoexp adapts only the per-neuron banks, so
``lite_recurrence`` refuses weights that require grad rather than drop their gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import triton
import triton.language as tl
from axosim import AxoSimLite

from axoexp.kernels.loss import KernelLoss

INTERPRETED: bool = triton.knobs.runtime.interpret
"""Whether the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""

NUM_WARPS = 1
"""One warp per program: on an H200 (triton 3.6) 16 neurons on one warp ran forward and
backward fastest of BLOCK_N 4..128 x 1..8 warps at 8k..1M neurons (backward up to 2x
faster than 4 warps)."""


@triton.jit
def _tanh(z):
    """tanh from ``exp`` alone (libdevice is unavailable in the interpreter).

    (1 - e) / (1 + e) with e = exp(-2|z|) cancels for small |z|, so below 1/16 the odd
    series z - z^3/3 + 2 z^5/15 is used (truncation error < 4e-9 relative there).
    """
    magnitude = tl.abs(z)
    e = tl.exp(-2.0 * magnitude)
    square = magnitude * magnitude
    series = magnitude * (1.0 + square * (-1.0 / 3.0 + square * (2.0 / 15.0)))
    value = tl.where(magnitude < 0.0625, series, (1.0 - e) / (1.0 + e))
    return tl.where(z < 0.0, -value, value)


@triton.jit
def _matvec(vectors, matrix):
    """``vectors @ matrix.T`` for (BLOCK_N, IN) vectors and an (OUT, IN) matrix, in registers."""
    return tl.sum(vectors[:, None, :] * matrix[None, :, :], axis=2)


@triton.jit
def _matvec_t(vectors, matrix):
    """``vectors @ matrix`` for (BLOCK_N, OUT) vectors and an (OUT, IN) matrix, in registers."""
    return tl.sum(vectors[:, :, None] * matrix[None, :, :], axis=1)


@triton.jit
def _load_matrix(pointer, rows, columns, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """A row-major (rows, columns) matrix zero-padded to (ROWS, COLUMNS)."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLUMNS)
    mask = (r < rows)[:, None] & (c < columns)[None, :]
    return tl.load(pointer + r[:, None] * columns + c[None, :], mask=mask, other=0.0)


@triton.jit
def _load_vector(pointer, width, WIDTH: tl.constexpr):
    """A vector zero-padded to WIDTH, shaped (1, WIDTH) to broadcast over neurons."""
    c = tl.arange(0, WIDTH)
    return tl.load(pointer + c, mask=c < width, other=0.0)[None, :]


@triton.jit
def _window_lanes(CONTACTS: tl.constexpr, CONTACTS_PAD: tl.constexpr, PATCH: tl.constexpr, PATCH_PAD: tl.constexpr):
    """A P4 block's contact inputs as lanes ``step * CONTACTS_PAD + contact``: each lane's step,
    contact and whether it is one, each (1, PATCH_PAD * CONTACTS_PAD)."""
    lane = tl.arange(0, PATCH_PAD * CONTACTS_PAD)[None, :]
    step = lane // CONTACTS_PAD
    contact = lane % CONTACTS_PAD
    return step, contact, (step < PATCH) & (contact < CONTACTS)


@triton.jit
def _load_window(
    inputs,
    rows,
    input_steps,
    block,
    mask,
    CONTACTS: tl.constexpr,
    CONTACTS_PAD: tl.constexpr,
    PATCH: tl.constexpr,
    PATCH_PAD: tl.constexpr,
):
    """The (BLOCK_N, WINDOW) raw contact inputs of P4 block ``block`` of (rows, input_steps, CONTACTS) ``inputs``."""
    step, contact, in_range = _window_lanes(CONTACTS, CONTACTS_PAD, PATCH, PATCH_PAD)
    offset = (rows[:, None] * input_steps + block * PATCH + step) * CONTACTS + contact
    return tl.load(inputs + offset, mask=mask & in_range, other=0.0)


@triton.jit
def _project(window, efficacy, projection, projection_bias):
    """Tokens (BLOCK_N, TOKEN_PAD) from a block's contact inputs: the projection of the contact summaries,
    ``projection[n, k, lane]`` being the input projection's weight times the contact's route features."""
    return tl.sum((window * efficacy)[:, None, :] * projection, axis=2) + projection_bias


@triton.jit
def _front_rows(
    morphology,
    morphology_indices,
    log_efficacy,
    projection,
    bank_row,
    row_ok,
    CACHE: tl.constexpr,
    TOKEN: tl.constexpr,
    TOKEN_PAD: tl.constexpr,
    CONTACTS: tl.constexpr,
    CONTACTS_PAD: tl.constexpr,
    PATCH: tl.constexpr,
    PATCH_PAD: tl.constexpr,
):
    """Per row of the neuron ``bank_row``: a pointer to its morphology bank row, its efficacies in the
    window's lanes (BLOCK_N, WINDOW) and its (BLOCK_N, TOKEN_PAD, WINDOW) projection, zero where padded."""
    morphology_row = tl.load(morphology_indices + bank_row[:, None], mask=row_ok, other=0)
    _, contact, in_window = _window_lanes(CONTACTS, CONTACTS_PAD, PATCH, PATCH_PAD)
    efficacy = tl.exp(
        tl.load(log_efficacy + bank_row[:, None] * CONTACTS + contact, mask=row_ok & in_window, other=0.0)
    )
    WINDOW: tl.constexpr = PATCH_PAD * CONTACTS_PAD
    token = tl.arange(0, TOKEN_PAD)[None, :, None]
    lane = tl.arange(0, WINDOW)[None, None, :]
    projection_matrix = tl.load(
        projection + bank_row[:, None, None] * (TOKEN * WINDOW) + token * WINDOW + lane,
        mask=row_ok[:, :, None] & (token < TOKEN),
        other=0.0,
    )
    return morphology + morphology_row * CACHE, efficacy, projection_matrix


@triton.jit
def _cache_lanes(row_cache, row_morphology, lanes, mask, FRONT: tl.constexpr):
    """Lanes of each row's adaptation cache: the cache's, or with FRONT the behaviour bank's
    plus the morphology bank's."""
    values = tl.load(row_cache + lanes, mask=mask, other=0.0)
    if FRONT:
        values += tl.load(row_morphology + lanes, mask=mask, other=0.0)
    return values


@triton.jit
def _adaptation(
    row_cache,
    row_morphology,
    bias,
    decay_logit,
    k,
    s,
    o,
    k_ok,
    s_ok,
    o_ok,
    TOKEN: tl.constexpr,
    STATE: tl.constexpr,
    OUTPUT: tl.constexpr,
    STATE_PAD: tl.constexpr,
    FRONT: tl.constexpr,
):
    """Each row's adaptation from its cache lanes (:func:`_cache_lanes`), as the module docstring's
    equations use it: token offset, token scale ``1 + gain``, decay ``d``, state scale, the proposal's
    shift (state bias plus offset), output scale and output offset."""
    token_offset = _cache_lanes(row_cache, row_morphology, k, k_ok, FRONT)
    token_scale = 1.0 + _cache_lanes(row_cache, row_morphology, TOKEN + k, k_ok, FRONT)
    decay = tl.sigmoid(
        _load_vector(decay_logit, STATE, STATE_PAD)
        + _cache_lanes(row_cache, row_morphology, 2 * TOKEN + s, s_ok, FRONT)
    )
    state_scale = 1.0 + _cache_lanes(row_cache, row_morphology, 2 * TOKEN + STATE + s, s_ok, FRONT)
    state_shift = bias + _cache_lanes(row_cache, row_morphology, 2 * TOKEN + 2 * STATE + s, s_ok, FRONT)
    output_scale = 1.0 + _cache_lanes(row_cache, row_morphology, 2 * TOKEN + 3 * STATE + o, o_ok, FRONT)
    output_offset = _cache_lanes(row_cache, row_morphology, 2 * TOKEN + 3 * STATE + OUTPUT + o, o_ok, FRONT)
    return token_offset, token_scale, decay, state_scale, state_shift, output_scale, output_offset


@triton.jit
def _put(pointer, values, mask, ACCUMULATE: tl.constexpr):
    """Store ``values``, or with ``ACCUMULATE`` add them atomically (rows of several streams or
    neurons may meet in one bank row)."""
    if ACCUMULATE:
        tl.atomic_add(pointer, values, mask=mask)
    else:
        tl.store(pointer, values, mask=mask)


@triton.jit
def _put_cache_gradient(
    row_grad,
    token_offset,
    token_gain,
    decay,
    state_gain,
    state_offset,
    output_gain,
    output_offset,
    k,
    s,
    o,
    k_ok,
    s_ok,
    o_ok,
    TOKEN: tl.constexpr,
    STATE: tl.constexpr,
    OUTPUT: tl.constexpr,
    ACCUMULATE: tl.constexpr,
):
    """A cache gradient's seven parts (token offset and gain, decay, state gain and offset, output gain
    and offset) into their lanes of ``row_grad``, as axosim packs the cache (:func:`_adaptation`)."""
    _put(row_grad + k, token_offset, k_ok, ACCUMULATE)
    _put(row_grad + TOKEN + k, token_gain, k_ok, ACCUMULATE)
    _put(row_grad + 2 * TOKEN + s, decay, s_ok, ACCUMULATE)
    _put(row_grad + 2 * TOKEN + STATE + s, state_gain, s_ok, ACCUMULATE)
    _put(row_grad + 2 * TOKEN + 2 * STATE + s, state_offset, s_ok, ACCUMULATE)
    _put(row_grad + 2 * TOKEN + 3 * STATE + o, output_gain, o_ok, ACCUMULATE)
    _put(row_grad + 2 * TOKEN + 3 * STATE + OUTPUT + o, output_offset, o_ok, ACCUMULATE)


@triton.jit
def _sum_of(values, count, BLOCK: tl.constexpr):
    """The sum of ``values[:count]``, added in one fixed order."""
    total = tl.zeros([BLOCK], tl.float32)
    for start in range(0, count, BLOCK):
        index = start + tl.arange(0, BLOCK)
        total += tl.load(values + index, mask=index < count, other=0.0)
    return tl.sum(total, axis=0)


NO_LOSS: tl.constexpr = tl.constexpr(0)
SQUARED: tl.constexpr = tl.constexpr(1)
"""``LOSS`` code: the squared error, ``(y - t)^2`` (torch's ``mse_loss``)."""
HUBER: tl.constexpr = tl.constexpr(2)
"""``LOSS`` code: the Huber error with threshold ``delta`` (torch's ``huber_loss``)."""


@triton.jit
def _pointwise_error(difference, delta, LOSS: tl.constexpr):
    """The error of ``difference`` = prediction - target and its derivative in the prediction,
    as torch's ``mse_loss`` and ``huber_loss`` compute them."""
    if LOSS == SQUARED:
        return difference * difference, 2.0 * difference
    magnitude = tl.abs(difference)
    error = tl.where(magnitude < delta, 0.5 * difference * difference, delta * (magnitude - 0.5 * delta))
    return error, tl.minimum(tl.maximum(difference, -delta), delta)


@triton.jit
def _lite_forward_kernel(
    tokens,
    cache,
    input_weight,
    recurrent_weight,
    state_bias,
    decay_logit,
    output_weight,
    output_bias,
    skip_weight,
    outputs,
    states,
    neurons,
    blocks,
    targets,
    length,
    partials,
    time_steps,
    warmup_steps,
    delta,
    morphology,
    morphology_indices,
    log_efficacy,
    projection,
    projection_bias,
    bank_rows,
    input_steps,
    TOKEN: tl.constexpr,
    STATE: tl.constexpr,
    OUTPUT: tl.constexpr,
    TOKEN_PAD: tl.constexpr,
    STATE_PAD: tl.constexpr,
    OUTPUT_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STORE_STATES: tl.constexpr,
    LOSS: tl.constexpr,
    MASKED: tl.constexpr,
    OUTPUT_DIM: tl.constexpr,
    FRONT: tl.constexpr,
    CONTACTS: tl.constexpr,
    CONTACTS_PAD: tl.constexpr,
    PATCH_STEPS: tl.constexpr,
    PATCH_STEPS_PAD: tl.constexpr,
):
    """One program runs every P4 block for BLOCK_N neurons; see the module docstring.

    With ``LOSS`` (:data:`SQUARED` or :data:`HUBER`, ``delta`` its threshold): ``targets`` are the
    (rows, time_steps, OUTPUT_DIM) targets, the loss keeps steps ``warmup_steps`` .. ``end - 1``
    with ``end`` = ``time_steps``, or with ``MASKED`` the smaller of it and the 0-dim ``length``;
    ``outputs`` receives d(loss)/d(forecast) and ``partials[program]`` this program's rows' share
    of the loss. Block ``b``'s forecast lane ``q`` is step ``PATCH (b + 1) + q // OUTPUT_DIM``; the
    first PATCH steps predict zero (axosim's warm-up), so they add to the loss but take no gradient."""
    CACHE: tl.constexpr = 2 * TOKEN + 3 * STATE + 2 * OUTPUT
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    population = tl.cast(neurons, tl.int64)  # int64 row arithmetic: no overflow at scale
    row_ok = (rows < neurons)[:, None]
    k = tl.arange(0, TOKEN_PAD)[None, :]
    s = tl.arange(0, STATE_PAD)[None, :]
    o = tl.arange(0, OUTPUT_PAD)[None, :]
    k_ok = row_ok & (k < TOKEN)
    s_ok = row_ok & (s < STATE)
    o_ok = row_ok & (o < OUTPUT)

    # Padded lanes load zeros, so their adapted token, proposal and state stay exactly 0.
    w_in = _load_matrix(input_weight, STATE, TOKEN, STATE_PAD, TOKEN_PAD)
    w_rec = _load_matrix(recurrent_weight, STATE, STATE, STATE_PAD, STATE_PAD)
    w_out = _load_matrix(output_weight, OUTPUT, STATE, OUTPUT_PAD, STATE_PAD)
    w_skip = _load_matrix(skip_weight, OUTPUT, TOKEN, OUTPUT_PAD, TOKEN_PAD)
    bias = _load_vector(state_bias, STATE, STATE_PAD)
    head_bias = _load_vector(output_bias, OUTPUT, OUTPUT_PAD)

    # With FRONT the cache is the behaviour bank plus the morphology bank, by the row's neuron
    # (streams share the banks), and each block's token is projected from the raw contact inputs.
    bank_row = rows % bank_rows
    row_cache = cache + bank_row[:, None] * CACHE
    row_morphology = row_cache
    if FRONT:
        row_morphology, efficacy, projection_matrix = _front_rows(
            morphology,
            morphology_indices,
            log_efficacy,
            projection,
            bank_row,
            row_ok,
            CACHE,
            TOKEN,
            TOKEN_PAD,
            CONTACTS,
            CONTACTS_PAD,
            PATCH_STEPS,
            PATCH_STEPS_PAD,
        )
        token_bias = _load_vector(projection_bias, TOKEN, TOKEN_PAD)
    token_offset, token_scale, decay, state_scale, state_shift, output_scale, output_offset = _adaptation(
        row_cache, row_morphology, bias, decay_logit, k, s, o, k_ok, s_ok, o_ok, TOKEN, STATE, OUTPUT, STATE_PAD, FRONT
    )

    # ``index``: row of (block, neuron) in the time-major (blocks * neurons, width) views.
    # Each iteration prefetches the next block's token, so its load latency overlaps
    # this block's arithmetic instead of stalling the sequential chain.
    end = blocks * population
    index = rows[:, None]
    if FRONT:
        window = _load_window(
            tokens, rows, input_steps, 0, row_ok, CONTACTS, CONTACTS_PAD, PATCH_STEPS, PATCH_STEPS_PAD
        )
    else:
        token = tl.load(tokens + index * TOKEN + k, mask=k_ok, other=0.0)
    state = tl.zeros((BLOCK_N, STATE_PAD), dtype=tl.float32)
    if LOSS != NO_LOSS:
        # Lane o of a block's forecast is o // OUTPUT_DIM steps after the block's first step.
        PATCH: tl.constexpr = OUTPUT // OUTPUT_DIM
        last = time_steps
        if MASKED:
            last = tl.minimum(tl.load(length).to(tl.int64), time_steps)
        kept = tl.maximum(last - warmup_steps, 0)
        scale = 1.0 / (tl.cast(kept, tl.float32) * tl.cast(neurons, tl.float32) * OUTPUT_DIM)
        row_targets = targets + rows[:, None] * time_steps * OUTPUT_DIM + o
        lane_step = o // OUTPUT_DIM
        # axosim's warm-up: the first PATCH steps predict zero; their error counts, with no gradient.
        kept_lanes = o_ok & (lane_step >= warmup_steps) & (lane_step < last)
        target = tl.load(row_targets, mask=kept_lanes, other=0.0)
        error, _ = _pointwise_error(-target, delta, LOSS)
        total = tl.where(kept_lanes, error, 0.0)
        target = tl.load(row_targets + OUTPUT, mask=o_ok & (PATCH + lane_step < last), other=0.0)
    for block in range(blocks):
        following = index + population
        if FRONT:
            next_window = _load_window(
                tokens,
                rows,
                input_steps,
                block + 1,
                row_ok & (following < end),
                CONTACTS,
                CONTACTS_PAD,
                PATCH_STEPS,
                PATCH_STEPS_PAD,
            )
            token = _project(window, efficacy, projection_matrix, token_bias)
        else:
            next_token = tl.load(tokens + following * TOKEN + k, mask=k_ok & (following < end), other=0.0)
        adapted = (token + token_offset) * token_scale
        proposal = _tanh(_matvec(adapted, w_in) + _matvec(state, w_rec) + state_shift)
        state = decay * state + (1.0 - decay) * (proposal * state_scale)
        head = _matvec(state, w_out) + head_bias + _matvec(adapted, w_skip)
        forecast = head * output_scale + output_offset
        if LOSS != NO_LOSS:
            step = PATCH * (block + 1) + lane_step
            next_target = tl.load(row_targets + (block + 2) * OUTPUT, mask=o_ok & (step + PATCH < last), other=0.0)
            kept_lanes = o_ok & (step >= warmup_steps) & (step < last)
            error, slope = _pointwise_error(forecast - target, delta, LOSS)
            total += tl.where(kept_lanes, error, 0.0)
            tl.store(outputs + index * OUTPUT + o, tl.where(kept_lanes, slope * scale, 0.0), mask=o_ok)
            target = next_target
        else:
            tl.store(outputs + index * OUTPUT + o, forecast, mask=o_ok)
        if STORE_STATES:
            tl.store(states + index * STATE + s, state, mask=s_ok)
        index = following
        if FRONT:
            window = next_window
        else:
            token = next_token
    if LOSS != NO_LOSS:
        tl.store(partials + tl.program_id(0), tl.sum(tl.sum(total, axis=1), axis=0) * scale)


@triton.jit
def _lite_backward_kernel(
    tokens,
    cache,
    input_weight,
    recurrent_weight,
    state_bias,
    decay_logit,
    output_weight,
    output_bias,
    skip_weight,
    states,
    grad_outputs,
    grad_tokens,
    grad_cache,
    neurons,
    blocks,
    grad_scale,
    morphology,
    morphology_indices,
    log_efficacy,
    projection,
    projection_bias,
    bank_rows,
    input_steps,
    behavior_grad,
    efficacy_grad,
    morphology_grad,
    partials,
    partial_count,
    loss,
    TOKEN: tl.constexpr,
    STATE: tl.constexpr,
    OUTPUT: tl.constexpr,
    TOKEN_PAD: tl.constexpr,
    STATE_PAD: tl.constexpr,
    OUTPUT_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STORE_INPUT_GRAD: tl.constexpr,
    SCALED: tl.constexpr,
    BANK_GRADS: tl.constexpr,
    FRONT: tl.constexpr,
    CONTACTS: tl.constexpr,
    CONTACTS_PAD: tl.constexpr,
    PATCH_STEPS: tl.constexpr,
    PATCH_STEPS_PAD: tl.constexpr,
):
    """Reverse-time adjoint of ``_lite_forward_kernel`` from its saved states; with ``SCALED``
    every output gradient is multiplied by the 0-dim ``grad_scale`` as it is loaded.

    With g = dL/ds_b (from later blocks plus this block's output):
        dL/du_b = dL/dy_b * (1 + output_gain),  u_b the pre-gain output
        g      += W_out^T dL/du_b
        dL/dz_b = g * (1 - d) * (1 + state_gain) * (1 - p_b^2)
        dL/da_b = W_skip^T dL/du_b + W_in^T dL/dz_b
        dL/ds_{b-1} = d * g + W_rec^T dL/dz_b
    The decay gradient is accumulated as sum_b g * (s_{b-1} - q_b), q_b = p_b (1 + state_gain),
    and multiplied by sigmoid' = d (1 - d) once at the end, since d does not depend on b.

    With ``BANK_GRADS`` (and ``FRONT``) no per-row gradients are stored: each row's cache gradient
    is added (atomically) into its neuron's row of ``behavior_grad`` and its morphology's row of
    ``morphology_grad``, its log-efficacy gradient into ``efficacy_grad`` (all zeroed by the caller),
    and program 0 writes to ``loss`` the sum of the forward's ``partial_count`` ``partials``.
    """
    tl.static_assert(FRONT or not BANK_GRADS, "the banks' gradients are added with the front in the kernel")
    CACHE: tl.constexpr = 2 * TOKEN + 3 * STATE + 2 * OUTPUT
    rows = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    population = tl.cast(neurons, tl.int64)  # int64 row arithmetic: no overflow at scale
    row_ok = (rows < neurons)[:, None]
    k = tl.arange(0, TOKEN_PAD)[None, :]
    s = tl.arange(0, STATE_PAD)[None, :]
    o = tl.arange(0, OUTPUT_PAD)[None, :]
    k_ok = row_ok & (k < TOKEN)
    s_ok = row_ok & (s < STATE)
    o_ok = row_ok & (o < OUTPUT)

    w_in = _load_matrix(input_weight, STATE, TOKEN, STATE_PAD, TOKEN_PAD)
    w_rec = _load_matrix(recurrent_weight, STATE, STATE, STATE_PAD, STATE_PAD)
    w_out = _load_matrix(output_weight, OUTPUT, STATE, OUTPUT_PAD, STATE_PAD)
    w_skip = _load_matrix(skip_weight, OUTPUT, TOKEN, OUTPUT_PAD, TOKEN_PAD)
    bias = _load_vector(state_bias, STATE, STATE_PAD)
    head_bias = _load_vector(output_bias, OUTPUT, OUTPUT_PAD)

    # With FRONT the cache is the behaviour bank plus the morphology bank, by the row's neuron
    # (streams share the banks), and each block's token is projected from the raw contact inputs.
    bank_row = rows % bank_rows
    row_cache = cache + bank_row[:, None] * CACHE
    row_morphology = row_cache
    if FRONT:
        WINDOW: tl.constexpr = PATCH_STEPS_PAD * CONTACTS_PAD
        row_morphology, efficacy, projection_matrix = _front_rows(
            morphology,
            morphology_indices,
            log_efficacy,
            projection,
            bank_row,
            row_ok,
            CACHE,
            TOKEN,
            TOKEN_PAD,
            CONTACTS,
            CONTACTS_PAD,
            PATCH_STEPS,
            PATCH_STEPS_PAD,
        )
        token_bias = _load_vector(projection_bias, TOKEN, TOKEN_PAD)
    token_offset, token_scale, decay, state_scale, state_shift, output_scale, _ = _adaptation(
        row_cache, row_morphology, bias, decay_logit, k, s, o, k_ok, s_ok, o_ok, TOKEN, STATE, OUTPUT, STATE_PAD, FRONT
    )

    grad_token_offset = tl.zeros((BLOCK_N, TOKEN_PAD), dtype=tl.float32)
    grad_token_gain = tl.zeros((BLOCK_N, TOKEN_PAD), dtype=tl.float32)
    grad_decay = tl.zeros((BLOCK_N, STATE_PAD), dtype=tl.float32)
    grad_state_gain = tl.zeros((BLOCK_N, STATE_PAD), dtype=tl.float32)
    grad_state_offset = tl.zeros((BLOCK_N, STATE_PAD), dtype=tl.float32)
    grad_output_gain = tl.zeros((BLOCK_N, OUTPUT_PAD), dtype=tl.float32)
    grad_output_offset = tl.zeros((BLOCK_N, OUTPUT_PAD), dtype=tl.float32)
    grad_state = tl.zeros((BLOCK_N, STATE_PAD), dtype=tl.float32)

    # From the last block down; each iteration prefetches the earlier block's token,
    # output gradient and the state before it (s_{b-2}), as the forward prefetches tokens.
    index = ((blocks - 1) * population + rows)[:, None]
    state = tl.load(states + index * STATE + s, mask=s_ok, other=0.0)
    previous = tl.load(states + (index - population) * STATE + s, mask=s_ok & (index >= population), other=0.0)
    if FRONT:
        window = _load_window(
            tokens, rows, input_steps, blocks - 1, row_ok, CONTACTS, CONTACTS_PAD, PATCH_STEPS, PATCH_STEPS_PAD
        )
        grad_window = tl.zeros((BLOCK_N, WINDOW), dtype=tl.float32)
    else:
        token = tl.load(tokens + index * TOKEN + k, mask=k_ok, other=0.0)
    scale = tl.load(grad_scale) if SCALED else 1.0
    grad_output = tl.load(grad_outputs + index * OUTPUT + o, mask=o_ok, other=0.0) * scale
    for iteration in range(blocks):
        earlier = index - population
        if FRONT:
            block = blocks - 1 - iteration
            next_window = _load_window(
                tokens,
                rows,
                input_steps,
                block - 1,
                row_ok & (earlier >= 0),
                CONTACTS,
                CONTACTS_PAD,
                PATCH_STEPS,
                PATCH_STEPS_PAD,
            )
            token = _project(window, efficacy, projection_matrix, token_bias)
        else:
            next_token = tl.load(tokens + earlier * TOKEN + k, mask=k_ok & (earlier >= 0), other=0.0)
        next_grad_output = tl.load(grad_outputs + earlier * OUTPUT + o, mask=o_ok & (earlier >= 0), other=0.0) * scale
        next_previous = tl.load(
            states + (earlier - population) * STATE + s,
            mask=s_ok & (earlier >= population),
            other=0.0,
        )
        shifted = token + token_offset
        adapted = shifted * token_scale
        proposal = _tanh(_matvec(adapted, w_in) + _matvec(previous, w_rec) + state_shift)
        head = _matvec(state, w_out) + head_bias + _matvec(adapted, w_skip)

        grad_output_offset += grad_output
        grad_output_gain += grad_output * head
        grad_head = grad_output * output_scale
        grad_state += _matvec_t(grad_head, w_out)

        grad_decay += grad_state * (previous - proposal * state_scale)
        grad_scaled = grad_state * (1.0 - decay)
        grad_state_gain += grad_scaled * proposal
        grad_argument = grad_scaled * state_scale * (1.0 - proposal * proposal)
        grad_state_offset += grad_argument

        grad_adapted = _matvec_t(grad_head, w_skip) + _matvec_t(grad_argument, w_in)
        grad_token = grad_adapted * token_scale
        grad_token_offset += grad_token
        grad_token_gain += grad_adapted * shifted
        if FRONT:
            # d token / d (input x efficacy) is the projection; x times it is d token / d efficacy.
            grad_window += tl.sum(grad_token[:, :, None] * projection_matrix, axis=1) * window
        elif STORE_INPUT_GRAD:
            tl.store(grad_tokens + index * TOKEN + k, grad_token, mask=k_ok)

        grad_state = decay * grad_state + _matvec_t(grad_argument, w_rec)
        index = earlier
        state = previous
        previous = next_previous
        if FRONT:
            window = next_window
        else:
            token = next_token
        grad_output = next_grad_output

    grad_decay = grad_decay * decay * (1.0 - decay)
    if BANK_GRADS:  # the neuron's behaviour row, shared by its streams
        row_grad = behavior_grad + bank_row[:, None] * CACHE
    else:
        row_grad = grad_cache + rows[:, None] * CACHE
    _put_cache_gradient(
        row_grad,
        grad_token_offset,
        grad_token_gain,
        grad_decay,
        grad_state_gain,
        grad_state_offset,
        grad_output_gain,
        grad_output_offset,
        k,
        s,
        o,
        k_ok,
        s_ok,
        o_ok,
        TOKEN,
        STATE,
        OUTPUT,
        BANK_GRADS,
    )
    if BANK_GRADS:  # and its morphology's row, shared by the morphology's neurons
        morphology_row = tl.load(morphology_indices + bank_row[:, None], mask=row_ok, other=0)
        _put_cache_gradient(
            morphology_grad + morphology_row * CACHE,
            grad_token_offset,
            grad_token_gain,
            grad_decay,
            grad_state_gain,
            grad_state_offset,
            grad_output_gain,
            grad_output_offset,
            k,
            s,
            o,
            k_ok,
            s_ok,
            o_ok,
            TOKEN,
            STATE,
            OUTPUT,
            True,
        )
    if FRONT and (STORE_INPUT_GRAD or BANK_GRADS):
        # d/d log-efficacy = efficacy x d/d efficacy, summed over the patch's steps: the row's share
        # of the log-efficacies' gradient (batched streams: one share per stream).
        per_step = tl.reshape(grad_window * efficacy, (BLOCK_N, PATCH_STEPS_PAD, CONTACTS_PAD))
        c = tl.arange(0, CONTACTS_PAD)[None, :]
        c_ok = row_ok & (c < CONTACTS)
        if BANK_GRADS:
            tl.atomic_add(efficacy_grad + bank_row[:, None] * CONTACTS + c, tl.sum(per_step, axis=1), mask=c_ok)
        else:
            tl.store(grad_tokens + rows[:, None] * CONTACTS + c, tl.sum(per_step, axis=1), mask=c_ok)
    if BANK_GRADS:
        if tl.program_id(0) == 0:
            total = _sum_of(partials, partial_count, 128)
            tl.store(loss + tl.arange(0, 1), total + tl.zeros([1], tl.float32))


ONE_ROW_PER_PROGRAM_UP_TO = 4096
"""Rows up to which each program runs one row. Whole updates on an H200 (2026-12-04,
``benchmarks/results/update-latency_h200_2026-12-04_block-n*.md``): one row per program was the
fastest of 1, 2, 4, 8 and 16 at 64, 1024 and 4096 rows (16 per program 1.77x, 1.30x and 1.09x
slower); at 16,384 rows 16 per program was 3% faster than one."""


def default_block_n(token_dim: int, state_dim: int, outputs: int, rows: int, window: int = 1) -> int:
    """Rows per program: one up to :data:`ONE_ROW_PER_PROGRAM_UP_TO` rows (many programs, each a
    short dependent chain: the recurrence is latency-bound), else 16 (measured best with
    ``NUM_WARPS`` at 8k..1M rows), halved while the widest (rows, out, in) broadcast product of
    the in-register matrix-vector products (with the front in the kernels, also each row's (token,
    ``window``) projection) would exceed 1024 values, 32 a thread, so large widths do not spill registers."""
    if rows <= ONE_ROW_PER_PROGRAM_UP_TO:
        return 1
    token, state, output = (triton.next_power_of_2(width) for width in (token_dim, state_dim, outputs))
    widest = max(state * token, state * state, output * state, output * token, token * window)
    block_n = 16
    while block_n > 1 and block_n * widest > 1024:
        block_n //= 2
    return block_n


def _weights(neuron: AxoSimLite) -> tuple[torch.Tensor, ...]:
    """The neuron's shared weights in the kernels' argument order."""
    return (
        neuron.support_input.weight,
        neuron.support_recurrent.weight,
        neuron.state_bias,
        neuron.shared_decay_logit,
        neuron.output_head.weight,
        neuron.output_head.bias,
        neuron.skip_head.weight,
    )


def _launch_config(
    rows: int, token_dim: int, weights: tuple[torch.Tensor, ...], block_n: int
) -> tuple[tuple[int], dict[str, int]]:
    """Grid and constexprs: both depend on shapes only (CUDA-graph capturable)."""
    state_dim = weights[0].shape[0]
    outputs = weights[4].shape[0]
    constants = {
        "TOKEN": token_dim,
        "STATE": state_dim,
        "OUTPUT": outputs,
        "TOKEN_PAD": triton.next_power_of_2(token_dim),
        "STATE_PAD": triton.next_power_of_2(state_dim),
        "OUTPUT_PAD": triton.next_power_of_2(outputs),
        "BLOCK_N": block_n,
    }
    return (triton.cdiv(rows, block_n),), constants


NO_LOSS_ARGUMENTS = {
    "time_steps": 0,
    "warmup_steps": 0,
    "delta": 0.0,
    "LOSS": NO_LOSS.value,
    "MASKED": False,
    "OUTPUT_DIM": 1,
}
"""The forward kernel's loss arguments when it computes no loss (the pointers are any tensor's)."""


@dataclass(frozen=True)
class Front:
    """What the kernels read, besides the banks, to compute each row's tokens and cache themselves
    (:func:`lite_front_recurrence`): constants of the population, none a bank's value."""

    projection: torch.Tensor
    """(neurons, token_dim, window): the input projection's weight times each contact's route features,
    lane ``step * next_power_of_2(contacts) + contact`` of a patch (:func:`contact_projection`)."""
    projection_bias: torch.Tensor
    """(token_dim,) the input projection's bias."""
    morphology_indices: torch.Tensor
    """(neurons,) int64: each neuron's row of the morphology bank."""
    patch: int
    contacts: int

    @property
    def neurons(self) -> int:
        return self.morphology_indices.shape[0]

    @property
    def window(self) -> int:
        """Lanes of one patch's contact inputs in the kernels (both widths padded to powers of 2)."""
        return triton.next_power_of_2(self.patch) * triton.next_power_of_2(self.contacts)


def contact_projection(neuron: AxoSimLite, route_features: torch.Tensor) -> torch.Tensor:
    """:attr:`Front.projection` from the (neurons, contacts, route_features) route features of each
    contact: token ``k`` of a patch is ``bias[k] + sum(projection[n, k, lane] * input[lane] * efficacy[lane])``,
    the input projection of the contact summaries (zero in the padded lanes)."""
    weight = neuron.input_projection.weight.detach()
    token_dim, patch = weight.shape[0], neuron.patch_size
    neurons, contacts, features = route_features.shape
    padded = weight.new_zeros(neurons, token_dim, triton.next_power_of_2(patch), triton.next_power_of_2(contacts))
    per_step = weight.view(token_dim, patch, features)
    padded[:, :, :patch, :contacts] = torch.einsum("kpf,ncf->nkpc", per_step, route_features.detach())
    return padded.reshape(neurons, token_dim, -1)


def _front_arguments(
    front: Front | None, log_efficacy: torch.Tensor | None, morphology: torch.Tensor | None, source: torch.Tensor
) -> dict[str, Any]:
    """The kernels' front arguments: without ``front`` (``source`` the tokens) unused pointers are
    ``source`` and every row is its own bank row; with it ``source`` is the (rows, steps, contacts) inputs."""
    if front is None:
        pointers = ("morphology", "morphology_indices", "log_efficacy", "projection", "projection_bias")
        return dict.fromkeys(pointers, source) | {
            "bank_rows": source.shape[1],
            "input_steps": 0,
            "FRONT": False,
            "CONTACTS": 1,
            "CONTACTS_PAD": 1,
            "PATCH_STEPS": 1,
            "PATCH_STEPS_PAD": 1,
        }
    return {
        "morphology": morphology,
        "morphology_indices": front.morphology_indices,
        "log_efficacy": log_efficacy,
        "projection": front.projection,
        "projection_bias": front.projection_bias,
        "bank_rows": front.neurons,
        "input_steps": source.shape[1],
        "FRONT": True,
        "CONTACTS": front.contacts,
        "CONTACTS_PAD": triton.next_power_of_2(front.contacts),
        "PATCH_STEPS": front.patch,
        "PATCH_STEPS_PAD": triton.next_power_of_2(front.patch),
    }


def _shape(source: torch.Tensor, front: Front | None) -> tuple[int, int]:
    """(blocks, rows) of time-major tokens, or with ``front`` of (rows, steps, contacts) contact inputs."""
    if front is None:
        return source.shape[0], source.shape[1]
    return source.shape[1] // front.patch, source.shape[0]


def _forward(
    source: torch.Tensor,
    cache: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    block_n: int,
    *,
    store_states: bool,
    loss: dict[str, Any] | None = None,
    front: Front | None = None,
    log_efficacy: torch.Tensor | None = None,
    morphology: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the forward kernel: (outputs, states, partials). ``source`` and ``cache`` are the tokens
    and cache, or with ``front`` the contact inputs and the behaviour bank. Without ``loss`` the outputs are
    the forecasts and ``partials`` is None; with it (the kernel's loss arguments, :class:`LiteRecurrenceLoss`)
    the outputs are the loss's gradient and ``partials`` the programs' shares of the loss. Without
    stored states ``outputs`` stands in as the states' pointer, and as any unused one."""
    token_dim = weights[0].shape[1]
    blocks, rows = _shape(source, front)
    outputs = source.new_empty(blocks, rows, weights[4].shape[0])
    states = source.new_empty(blocks, rows, weights[0].shape[0]) if store_states else outputs
    grid, constants = _launch_config(rows, token_dim, weights, block_n)
    partials = None if loss is None else source.new_empty(grid)
    if rows:  # CUDA refuses an empty grid
        _lite_forward_kernel[grid](
            source,
            cache,
            *weights,
            outputs,
            states,
            rows,
            blocks,
            **(loss or NO_LOSS_ARGUMENTS | {"targets": outputs, "length": outputs}),
            partials=outputs if partials is None else partials,
            **_front_arguments(front, log_efficacy, morphology, source),
            STORE_STATES=store_states,
            num_warps=NUM_WARPS,
            **constants,
        )
    return outputs, states, partials


def _launch_backward(
    saved: tuple[torch.Tensor, ...],
    front: Front | None,
    block_n: int,
    grad_outputs: torch.Tensor,
    grad_scale: torch.Tensor | None,
    *,
    need_input: bool,
    bank_grads: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Launch the backward kernel on what the forward saved (``saved``: source, cache or behaviour bank,
    log-efficacies, morphology bank, states, then the weights): (the source's gradient or, with the front,
    each row's share of the log-efficacies', if ``need_input``; each row's cache gradient). With
    ``bank_grads`` (behaviour, log-efficacy and morphology gradients, zeroed, then the forward's partials
    and a 0-dim loss) the kernel adds the banks' gradients into them and writes the loss instead, and
    both results are None."""
    source, cache, log_efficacy, morphology, states, *weights = saved
    token_dim = weights[0].shape[1]
    blocks, rows = _shape(source, front)
    grad_input = grad_cache = None
    if need_input:  # the tokens' gradient, or with the front each row's share of the log-efficacies'
        grad_input = torch.empty_like(source) if front is None else source.new_empty(rows, front.contacts)
    if bank_grads is None:
        grad_cache = cache.new_empty(rows, cache.shape[1])
    unused = dict.fromkeys(("behavior_grad", "efficacy_grad", "morphology_grad", "partials", "loss"), source)
    partial_count = 0 if bank_grads is None else bank_grads[3].numel()
    grid, constants = _launch_config(rows, token_dim, tuple(weights), block_n)
    if rows:
        _lite_backward_kernel[grid](
            source,
            cache,
            *weights,
            states,
            grad_outputs.contiguous(),
            source if grad_input is None else grad_input,  # without an input gradient the kernel stores none
            source if grad_cache is None else grad_cache,
            rows,
            blocks,
            source if grad_scale is None else grad_scale,
            **_front_arguments(front, log_efficacy, morphology, source),
            **(unused if bank_grads is None else dict(zip(unused, bank_grads, strict=True))),
            partial_count=partial_count,
            STORE_INPUT_GRAD=need_input,
            SCALED=grad_scale is not None,
            BANK_GRADS=bank_grads is not None,
            num_warps=NUM_WARPS,
            **constants,
        )
    return grad_input, grad_cache


def _backward(ctx: Any, grad_outputs: torch.Tensor, grad_scale: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The backward kernel from what the forward saved: the gradients of the Functions' first
    four inputs (source, cache or behaviour bank, log-efficacies, morphology bank), None where not needed."""
    # Both Functions save source, cache, log-efficacies, morphology bank and states first and the weights
    # last (the loss's gradient between).
    saved = ctx.saved_tensors[:5] + ctx.saved_tensors[-ctx.weights :]
    front: Front | None = ctx.front
    need_input = ctx.needs_input_grad[0 if front is None else 2]
    grad_input, grad_cache = _launch_backward(
        saved, front, ctx.block_n, grad_outputs, grad_scale, need_input=need_input
    )
    grad_cache = cast(torch.Tensor, grad_cache)
    if front is None:
        return grad_input, grad_cache if ctx.needs_input_grad[1] else None, None, None
    return (None, *_bank_gradients(ctx, front, grad_cache, grad_input, cast(torch.Tensor, saved[3])))


def _bank_gradients(
    ctx: Any, front: Front, grad_cache: torch.Tensor, grad_efficacy: torch.Tensor | None, morphology: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    """The behaviour, log-efficacy and morphology banks' gradients from the kernel's per-row shares:
    one stream's rows are the neurons (no launch); B streams' are summed over streams (one each), and
    the morphology bank's is torch's ``index_add`` of the neurons' cache gradients (two: a zero fill and
    the add), deterministic on the CPU and to float32 rounding on CUDA, as the eager forward's own."""
    streams = grad_cache.shape[0] // front.neurons

    def per_neuron(per_row: torch.Tensor) -> torch.Tensor:
        return per_row if streams == 1 else per_row.view(streams, front.neurons, -1).sum(0)

    need_behavior, need_efficacy, need_morphology = ctx.needs_input_grad[1:4]
    grad_neurons = per_neuron(grad_cache) if need_behavior or need_morphology else grad_cache
    grad_morphology = None
    if need_morphology:
        grad_morphology = torch.zeros_like(morphology).index_add_(0, front.morphology_indices, grad_neurons)
    return (
        grad_neurons if need_behavior else None,
        per_neuron(grad_efficacy) if need_efficacy and grad_efficacy is not None else None,
        grad_morphology,
    )


class LiteRecurrence(torch.autograd.Function):
    """Autograd for the fused recurrence: gradients for ``source`` and ``cache`` (the tokens and the
    adaptation cache), or with ``front`` for the behaviour bank (``cache``), the log-efficacies and the
    morphology bank (``source`` then the contact inputs, which get none)."""

    @staticmethod
    def forward(
        ctx: Any,  # torch's FunctionCtx, which declares none of the attributes set and read here
        source: torch.Tensor,
        cache: torch.Tensor,
        log_efficacy: torch.Tensor | None,
        morphology: torch.Tensor | None,
        front: Front | None,
        block_n: int,
        store_states: bool,
        *weights: torch.Tensor,
    ) -> torch.Tensor:
        outputs, states, _ = _forward(
            source,
            cache,
            weights,
            block_n,
            store_states=store_states,
            front=front,
            log_efficacy=log_efficacy,
            morphology=morphology,
        )
        if store_states:
            ctx.save_for_backward(source, cache, log_efficacy, morphology, states, *weights)
        ctx.block_n, ctx.weights, ctx.front = block_n, len(weights), front
        return outputs

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (*_backward(ctx, grad_outputs, None), None, None, None, *(None,) * ctx.weights)


class LiteRecurrenceLoss(torch.autograd.Function):
    """The recurrence and a mean pointwise error over its forecasts in the forward kernel
    (:func:`lite_recurrence_loss`): returns the 0-dim loss; gradients as :class:`LiteRecurrence`'s."""

    @staticmethod
    def forward(
        ctx: Any,
        source: torch.Tensor,
        cache: torch.Tensor,
        log_efficacy: torch.Tensor | None,
        morphology: torch.Tensor | None,
        targets: torch.Tensor,
        length: torch.Tensor | None,
        loss: dict[str, Any],
        front: Front | None,
        block_n: int,
        *weights: torch.Tensor,
    ) -> torch.Tensor:
        arguments = {**loss, "targets": targets, "length": targets if length is None else length}
        grad_forecasts, states, partials = _forward(
            source,
            cache,
            weights,
            block_n,
            store_states=True,
            loss=arguments,
            front=front,
            log_efficacy=log_efficacy,
            morphology=morphology,
        )
        ctx.save_for_backward(source, cache, log_efficacy, morphology, states, grad_forecasts, *weights)
        ctx.block_n, ctx.weights, ctx.front = block_n, len(weights), front
        return cast(torch.Tensor, partials).sum()

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_forecasts = ctx.saved_tensors[5]
        return (*_backward(ctx, grad_forecasts, grad_loss.contiguous()), *(None,) * (5 + ctx.weights))


def _checked_weights(neuron: AxoSimLite, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The neuron's weights for the kernels, after checking that they and ``tensors`` are float32 and
    that no weight trains."""
    weights = tuple(weight.contiguous() for weight in _weights(neuron))
    if any(tensor.dtype != torch.float32 for tensor in (*tensors, *weights)):
        raise TypeError("the fused AxoSim-Lite recurrence runs float32 only")
    if torch.is_grad_enabled() and any(weight.requires_grad for weight in weights):
        raise ValueError("the fused AxoSim-Lite recurrence gives no gradient to neuron weights")
    return weights


def _checked_tokens(neuron: AxoSimLite, tokens: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`_checked_weights`, and the tokens' and cache's shapes."""
    weights = _checked_weights(neuron, tokens, cache)
    blocks, neurons, token_dim = tokens.shape
    if token_dim != neuron.config.token_dim or blocks < 1:
        raise ValueError(f"tokens must have shape (blocks >= 1, neurons, {neuron.config.token_dim})")
    if tuple(cache.shape) != (neurons, neuron.cache_width):
        raise ValueError(f"cache must have shape {(neurons, neuron.cache_width)}")
    return weights


def _checked_front(
    neuron: AxoSimLite, front: Front, inputs: torch.Tensor, banks: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """:func:`_checked_weights` (with the input projection's), and the inputs' and banks' shapes."""
    weights = _checked_weights(neuron, inputs, *banks, front.projection, front.projection_bias)
    rows, time_steps, contacts = inputs.shape
    if contacts != front.contacts or rows % max(front.neurons, 1) or time_steps < front.patch:
        raise ValueError(
            f"inputs must have shape (streams x {front.neurons}, steps >= {front.patch}, {front.contacts})"
        )
    behavior, morphology, log_efficacy = banks
    width = neuron.cache_width
    if behavior.shape != (front.neurons, width) or morphology.shape[1:] != (width,):
        raise ValueError(f"the behaviour and morphology banks must have {width} columns, one behaviour row a neuron")
    if log_efficacy.shape != (front.neurons, front.contacts):
        raise ValueError(f"the log-efficacies must have shape {(front.neurons, front.contacts)}")
    if torch.is_grad_enabled() and (inputs.requires_grad or front.projection_bias.requires_grad):
        raise ValueError("the fused front gives no gradient to the contact inputs or the input projection")
    return weights


def _block_n(weights: tuple[torch.Tensor, ...], rows: int, block_n: int | None, window: int = 1) -> int:
    if block_n is not None:
        return block_n
    return default_block_n(weights[0].shape[1], weights[0].shape[0], weights[4].shape[0], rows, window)


def lite_recurrence(
    neuron: AxoSimLite,
    tokens: torch.Tensor,
    cache: torch.Tensor,
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """Run ``neuron.step_token`` over every P4 block in one launch, differentiably.

    ``tokens``: (blocks, neurons, token_dim) projected P4 tokens, time-major; ``cache``:
    (neurons, cache_width) adaptation cache. Returns the (blocks, neurons, 4 * outputs)
    forecasts, time-major, float32. Gradients reach ``tokens`` and ``cache``; a neuron
    weight that requires grad (with grad mode on) is refused.
    """
    weights = _checked_tokens(neuron, tokens, cache)
    store_states = torch.is_grad_enabled() and (tokens.requires_grad or cache.requires_grad)
    block_n = _block_n(weights, tokens.shape[1], block_n)
    return LiteRecurrence.apply(
        tokens.contiguous(), cache.contiguous(), None, None, None, block_n, store_states, *weights
    )


def lite_front_recurrence(
    neuron: AxoSimLite,
    front: Front,
    inputs: torch.Tensor,
    banks: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """:func:`lite_recurrence` with the tokens and the cache computed in the kernels: ``inputs`` the
    (streams x neurons, time, contacts) contact inputs, stream-major; ``banks`` the population's
    (behaviour, morphology, log-efficacy) banks, which get the gradients. Forecasts of the whole patches."""
    weights = _checked_front(neuron, front, inputs, banks)
    behavior, morphology, log_efficacy = banks
    store_states = torch.is_grad_enabled() and any(bank.requires_grad for bank in banks)
    block_n = _block_n(weights, inputs.shape[0], block_n, front.window)
    return LiteRecurrence.apply(
        inputs.contiguous(),
        behavior.contiguous(),
        log_efficacy.contiguous(),
        morphology.contiguous(),
        front,
        block_n,
        store_states,
        *weights,
    )


ERROR_CODES = {"squared": SQUARED.value, "huber": HUBER.value}
"""The pointwise errors the forward kernel computes, by :class:`axoexp.components.losses.PointwiseError` kind."""


def _loss_arguments(
    neuron: AxoSimLite, rows: int, targets: torch.Tensor, loss: KernelLoss, masked: bool
) -> dict[str, Any]:
    """The forward kernel's loss arguments, after checking ``targets`` and ``loss.error``."""
    _, time_steps, outputs = targets.shape
    if (targets.shape[0], outputs) != (rows, neuron.config.output_dim) or targets.dtype != torch.float32:
        raise ValueError(f"targets must be float32 of shape ({rows}, time, {neuron.config.output_dim})")
    if loss.error not in ERROR_CODES:
        raise ValueError(f"error must be one of {sorted(ERROR_CODES)}, got {loss.error!r}")
    return {
        "time_steps": time_steps,
        "warmup_steps": loss.warmup_steps,
        "delta": float(loss.delta),
        "LOSS": ERROR_CODES[loss.error],
        "MASKED": masked,
        "OUTPUT_DIM": outputs,
    }


def lite_recurrence_loss(
    neuron: AxoSimLite,
    tokens: torch.Tensor,
    cache: torch.Tensor,
    targets: torch.Tensor,
    loss: KernelLoss,
    *,
    length: torch.Tensor | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """``loss`` (:class:`axoexp.kernels.loss.KernelLoss`) between the population's output
    and ``targets``, with the recurrence, the error and its gradient in the kernels.

    ``tokens`` and ``cache`` as for :func:`lite_recurrence`; ``targets``: (rows, time_steps,
    outputs). The output is axosim's: ``patch`` warm-up zeros, then the forecasts. The mean runs
    over the rows, the outputs and steps ``loss.warmup_steps`` .. ``end - 1``, where ``end`` is
    ``time_steps``, or with ``length`` (a 0-dim integer tensor on the device, read only there) the
    smaller of the two: :meth:`axoexp.components.losses.MeanOverSteps.masked` for padded batches.
    """
    weights = _checked_tokens(neuron, tokens, cache)
    arguments = _loss_arguments(neuron, tokens.shape[1], targets, loss, length is not None)
    block_n = _block_n(weights, tokens.shape[1], block_n)
    return LiteRecurrenceLoss.apply(
        tokens.contiguous(),
        cache.contiguous(),
        None,
        None,
        targets.contiguous(),
        length,
        arguments,
        None,
        block_n,
        *weights,
    )


def lite_front_recurrence_loss(
    neuron: AxoSimLite,
    front: Front,
    inputs: torch.Tensor,
    banks: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    targets: torch.Tensor,
    loss: KernelLoss,
    *,
    length: torch.Tensor | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """:func:`lite_recurrence_loss` with the tokens and the cache computed in the kernels
    (``inputs`` and ``banks`` as for :func:`lite_front_recurrence`)."""
    weights = _checked_front(neuron, front, inputs, banks)
    arguments = _loss_arguments(neuron, inputs.shape[0], targets, loss, length is not None)
    behavior, morphology, log_efficacy = banks
    block_n = _block_n(weights, inputs.shape[0], block_n, front.window)
    return LiteRecurrenceLoss.apply(
        inputs.contiguous(),
        behavior.contiguous(),
        log_efficacy.contiguous(),
        morphology.contiguous(),
        targets.contiguous(),
        length,
        arguments,
        front,
        block_n,
        *weights,
    )


def lite_front_loss_and_gradients(
    neuron: AxoSimLite,
    front: Front,
    inputs: torch.Tensor,
    banks: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    targets: torch.Tensor,
    loss: KernelLoss,
    *,
    length: torch.Tensor | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """:func:`lite_front_recurrence_loss` and its backward with no autograd, in two launches: returns
    the 0-dim loss, and adds the banks' gradients into ``grads`` (zeroed by the caller: the (behaviour,
    morphology, log-efficacy) banks' gradients, contiguous float32 of the banks' shapes). The backward
    kernel adds each row's share into its bank rows atomically, so rows that share a bank row (batched
    streams, a morphology's neurons) add up to float32 rounding in an order that may vary, as torch's
    ``index_add`` on CUDA does; and its program 0 sums the forward's shares of the loss."""
    weights = _checked_front(neuron, front, inputs, banks)
    if any(
        grad.shape != bank.shape or grad.dtype != torch.float32 or not grad.is_contiguous()
        for grad, bank in zip(grads, banks, strict=True)
    ):
        raise ValueError("the banks' gradients must be contiguous float32 tensors of the banks' shapes")
    arguments = _loss_arguments(neuron, inputs.shape[0], targets, loss, length is not None)
    behavior, morphology, log_efficacy = (bank.contiguous() for bank in banks)
    inputs, targets = inputs.contiguous(), targets.contiguous()
    block_n = _block_n(weights, inputs.shape[0], block_n, front.window)
    grad_forecasts, states, partials = _forward(
        inputs,
        behavior,
        weights,
        block_n,
        store_states=True,
        loss={**arguments, "targets": targets, "length": targets if length is None else length},
        front=front,
        log_efficacy=log_efficacy,
        morphology=morphology,
    )
    value = inputs.new_empty(())
    behavior_grad, morphology_grad, efficacy_grad = grads
    _launch_backward(
        (inputs, behavior, log_efficacy, morphology, states, *weights),
        front,
        block_n,
        grad_forecasts,
        None,
        need_input=False,
        bank_grads=(behavior_grad, efficacy_grad, morphology_grad, cast(torch.Tensor, partials), value),
    )
    return value
