"""The block loops behind ``vispe.kernels.relative_bias`` (private): forward and backward of
attention with a relative bias given as its table, block by block (that module's docstring).

``forward_blocks`` and ``backward_blocks`` are plain functions of tensors, shared by the eager
autograd function and the custom operator that compiled graphs call.
"""
from __future__ import annotations

import math

import torch

from vispe.kernels.bias_attention import _sdpa


def _key_order(L: int, P: int, device) -> torch.Tensor:
    """Prefix keys first, then the grid keys reversed (an involution).  # (L,) long"""
    return torch.cat([torch.arange(P, device=device), torch.arange(L - 1, P - 1, -1, device=device)])


def _row_blocks(B: int, H: int, h: int, w: int, L: int, chunk_bytes: int, batched: bool):
    """(batch, heads, grid rows) slices whose scores, float32 (all B when ``batched``, else one
    shared bias block), take about ``chunk_bytes``: whole heads when they fit, else groups of grid
    rows of one head; batch items apart only when one grid row of all of them does not fit."""
    row = w * L * 4  # one grid row of queries, one head, one batch item
    nb = B if not batched else max(1, min(B, chunk_bytes // row))
    per_rows = max(1, chunk_bytes // (row * nb))
    if per_rows >= h:
        nh = max(1, min(H, per_rows // h))
        nh = -(-H // -(-H // nh))  # blocks of equal size
        for b in range(0, B, nb):
            for hd in range(0, H, nh):
                yield slice(b, min(b + nb, B)), slice(hd, min(hd + nh, H)), slice(0, h)
        return
    ny = -(-h // -(-h // per_rows))
    for b in range(0, B, nb):
        for hd in range(H):
            for y in range(0, h, ny):
                yield slice(b, min(b + nb, B)), slice(hd, hd + 1), slice(y, min(y + ny, h))


def _grid_view(t2d: torch.Tensor, hs: slice, ys: slice, w: int) -> torch.Tensor:
    """Bias of grid query rows ``ys`` to the grid keys in reverse order, heads ``hs``, as a strided
    view of ``t2d`` (heads, 2h-1, 2w-1): ``t2d[head, y_i + y'_j, x_i + x'_j]``.  # (nh, ny, w, h, w)"""
    A, Bw = t2d.shape[1:]
    h = (A + 1) // 2
    nh, ny = hs.stop - hs.start, ys.stop - ys.start
    return t2d.as_strided((nh, ny, w, h, w), (A * Bw, Bw, 1, Bw, 1),
                          t2d.storage_offset() + hs.start * A * Bw + ys.start * Bw)


def _fold_grid_rows(g: torch.Tensor, ys: slice, w: int, dt2d: torch.Tensor) -> None:
    """Add the gradient ``g`` (nh, ny, w, h, w) of ``_grid_rows``' block into ``dt2d`` (nh, 2h-1, 2w-1)."""
    nh, ny, _, h, _ = g.shape
    acc = g.new_zeros(nh, ny, h, 2 * w - 1)  # summed over x: b = x_i + x'_j
    for x in range(w):
        acc[..., x:x + w] += g[:, :, x]
    for i in range(ny):  # summed over y: a = y_i + y'_j
        y = ys.start + i
        dt2d[:, y:y + h] += acc[:, i]


def _bias_block(t2d, prefix, hs, ys, w, P, out, shift=None, pre=False):
    """The bias of grid query rows ``ys`` (the prefix rows when ``ys`` is None; both, prefix rows
    first, when ``pre``), heads ``hs``, keys in kernel order (prefix, then grid reversed), minus
    ``shift`` (nh, nb, nr, 1) if given, written into ``out`` (nh, nb, nr, L) in one pass.  # out"""
    if pre:
        _bias_block(t2d, prefix, hs, None, w, P, out[:, :, :P], None if shift is None else shift[:, :, :P])
        _bias_block(t2d, prefix, hs, ys, w, P, out[:, :, P:], None if shift is None else shift[:, :, P:])
        return out
    nh, nb, nr, L = out.shape
    sub = (lambda src, dst, sh: dst.copy_(src)) if shift is None else \
        (lambda src, dst, sh: torch.sub(src, sh, out=dst))  # noqa: E731
    if ys is None:  # prefix queries: [prefix_to_prefix | prefix_to_token for every grid key]
        p2p, p2t, _ = prefix
        sub(p2p[hs, None], out[..., :P], shift)
        sub(p2t[hs, None, :, None].expand(nh, nb, nr, L - P), out[..., P:], shift)
        return out
    ny = ys.stop - ys.start
    if P:
        sub(prefix[2][hs, None, None, :].expand(nh, nb, nr, P), out[..., :P], shift)  # token_to_prefix
    h = (L - P) // w
    grid = out[..., P:].view(nh, nb, ny, w, h, w)  # a view of out, also when P > 0
    sub(_grid_view(t2d, hs, ys, w)[:, None], grid, None if shift is None else shift.view(nh, nb, ny, w, 1, 1))
    return out


class _Workspace:
    """One buffer per role for all the blocks of a call, so that each block's scores land in memory
    already mapped (a fresh multi-MiB tensor per block costs a page fault per 4 KiB on first touch,
    which took a third of the backward's time at 4,096 tokens)."""

    def __init__(self, device, dtype):
        self.device, self.dtype, self.bufs = device, dtype, {}

    def get(self, role: str, shape) -> torch.Tensor:
        n = math.prod(shape)
        buf = self.bufs.get(role)
        if buf is None or buf.numel() < n:
            buf = self.bufs[role] = torch.empty(n, dtype=self.dtype, device=self.device)
        return buf[:n].view(shape)


def forward_blocks(q, k, v, table, p2p, p2t, t2p, kpm, shape, chunk_bytes):
    """Output (B, heads, L, d) and log-sum-exp (B, heads, L) float32 (None when the kernel gives none)."""
    B, H, L, _ = q.shape
    h, w = shape
    P = L - h * w
    if P < 0 or (P > 0) != (p2p is not None) or (p2p is not None and p2p.shape[-1] != P):
        raise ValueError(f"q has {L} tokens for grid {tuple(shape)} and {0 if p2p is None else p2p.shape[-1]} prefix "
                         f"scalars: expected {h * w} + the number of prefix tokens")
    td = torch.promote_types(table.dtype, torch.float32)  # the bias's dtype (float32, float64 stays)
    prefix = None if p2p is None else (p2p.detach().to(td), p2t.detach().to(td), t2p.detach().to(td))
    t2d = table.detach().t().reshape(H, 2 * h - 1, 2 * w - 1).to(td).contiguous()  # (heads, 2h-1, 2w-1)
    order = _key_order(L, P, q.device)
    kr, vr = k.index_select(2, order), v.index_select(2, order)  # (B, heads, L, d), keys reordered
    kpr = None if kpm is None else kpm.index_select(1, order)  # (B, L)
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    have_lse = True
    ws = _Workspace(q.device, td)
    for bs, hs, ys, pre in _jobs(B, H, h, w, L, P, chunk_bytes, kpm is not None):
        rows = _rows(ys, P, w, pre)
        buf = ws.get("bias", (hs.stop - hs.start, 1, rows.stop - rows.start, L))
        mask = _bias_block(t2d, prefix, hs, ys, w, P, buf, pre=pre)
        have_lse &= _forward_block(q, kr, vr, kpr, out, lse, bs, hs, rows, mask[:, 0])
    return out, (lse if have_lse else None)


def backward_blocks(dout, q, k, v, table, p2p, p2t, t2p, kpm, out, lse, shape, chunk_bytes, needs):
    """Gradients of q, k, v, table, prefix_to_prefix, prefix_to_token, token_to_prefix (None where
    ``needs``, seven booleans, says no or the input is None)."""
    B, H, L, d = q.shape
    h, w = shape
    P = L - h * w
    wd = torch.promote_types(torch.promote_types(q.dtype, table.dtype), torch.float32)  # working dtype
    scale = 1.0 / math.sqrt(d)
    need_q, need_k, need_v, need_t = needs[:4]
    need_p = p2p is not None and any(needs[4:7])
    prefix = None if p2p is None else (p2p.to(wd), p2t.to(wd), t2p.to(wd))
    t2d = table.detach().t().reshape(H, 2 * h - 1, 2 * w - 1).to(wd).contiguous()
    order = _key_order(L, P, q.device)
    kr = k.index_select(2, order).transpose(0, 1).to(wd).contiguous()  # (heads, B, L, d), keys reordered
    vr1 = torch.ones(H, B, L, v.shape[-1] + 1, dtype=wd, device=q.device)  # [v | 1]: dO V^T - D in one product
    vr1[..., :-1] = v.index_select(2, order).transpose(0, 1)
    kpr = None if kpm is None else kpm.index_select(1, order)
    dnn = wd == torch.float32 and lse is not None and L >= 512 and q.device.type == "cpu" and onednn_linear()
    dq = torch.empty(q.shape, dtype=wd, device=q.device) if need_q else None
    if dnn:  # oneDNN's products give dK and dV transposed: (heads, B, d, L)
        krt = kr.transpose(-1, -2).contiguous()  # (heads, B, d, L)
        dkr = torch.zeros(krt.shape, dtype=wd, device=q.device) if need_k else None
        dvr = torch.zeros(H, B, v.shape[-1], L, dtype=wd, device=q.device) if need_v else None
    else:
        dkr = torch.zeros(kr.shape, dtype=wd, device=q.device) if need_k else None  # (heads, B, L, d)
        dvr = torch.zeros(kr.shape[:-1] + v.shape[-1:], dtype=wd, device=q.device) if need_v else None
    dt2d = torch.zeros_like(t2d) if need_t else None
    dpre = [torch.zeros_like(t) for t in prefix] if need_p else None
    do1 = torch.cat([dout.to(wd), -(dout.to(wd) * out.to(wd)).sum(-1, keepdim=True)], -1)  # [dO | -D] (B, H, L, d+1)
    ws = _Workspace(q.device, wd)
    def take(g, hs, ys, pre=False):  # the block's bias gradient g (nh, nr, L), summed over the batch
        if pre:
            take(g[:, :P], hs, None)
            take(g[:, P:], hs, ys)
            return
        if ys is None:
            if need_p:
                dpre[0][hs] += g[..., :P]
                dpre[1][hs] += g[..., P:].sum(-1)
            return
        if need_p and P:
            dpre[2][hs] += g[..., :P].sum(1)
        if need_t:
            ny = ys.stop - ys.start
            _fold_grid_rows(g[..., P:].unflatten(1, (ny, w)).unflatten(-1, (h, w)), ys, w, dt2d[hs])

    want_g = need_t or need_p
    for bs, hs, ys, pre in _jobs(B, H, h, w, L, P, chunk_bytes, not dnn):  # oneDNN: one batch item at a time
        rows = _rows(ys, P, w, pre)
        bias_into = lambda out, shift, hs=hs, ys=ys, pre=pre: _bias_block(  # noqa: E731
            t2d, prefix, hs, ys, w, P, out, shift, pre)
        if dnn:
            one_head = lambda out, shift, hd, ys=ys, pre=pre: _bias_block(  # noqa: E731
                t2d, prefix, slice(hd, hd + 1), ys, w, P, out, shift, pre)
            _backward_block_dnn(q, kr, krt, vr1, kpr, do1, lse, one_head, bs, hs, rows, scale, dq, dkr, dvr, ws,
                                (lambda g, hd, ys=ys, pre=pre: take(g, slice(hd, hd + 1), ys, pre)) if want_g else None)
            continue
        ds = _backward_block(q, kr, vr1, kpr, do1, lse, bias_into, bs, hs, rows, scale, wd, dq, dkr, dvr, ws)
        if want_g:
            take(ds.sum(1) if ds.shape[1] > 1 else ds[:, 0], hs, ys, pre)  # (nh, nr, L): the bias is shared by the batch
    if dnn:  # back to (heads, B, L, d)
        dkr = None if dkr is None else dkr.transpose(-1, -2)
        dvr = None if dvr is None else dvr.transpose(-1, -2)
    dk = None if not need_k else dkr.transpose(0, 1).index_select(2, order).to(k.dtype)
    dv = None if not need_v else dvr.transpose(0, 1).index_select(2, order).to(v.dtype)
    dtable = None if dt2d is None else dt2d.reshape(H, -1).t().to(table.dtype)
    dp = [None] * 3 if dpre is None else [g.to(t.dtype) if n else None
                                          for g, t, n in zip(dpre, (p2p, p2t, t2p), needs[4:7])]
    return (None if dq is None else dq.to(q.dtype), dk, dv, dtable, *dp)


def _jobs(B, H, h, w, L, P, chunk_bytes, batched):
    """The blocks of a pass, ``_row_blocks`` with a flag ``pre``: the first block of each (batch,
    heads) group also takes the P prefix query rows (one block fewer per group than apart)."""
    return [(bs, hs, ys, P > 0 and ys.start == 0) for bs, hs, ys in _row_blocks(B, H, h, w, L, chunk_bytes, batched)]


def _rows(ys: slice, P: int, w: int, pre: bool = False) -> slice:
    """Token rows of a block: grid rows ``ys`` after the prefix, and the prefix rows when ``pre``."""
    return slice(0 if pre else P + ys.start * w, P + ys.stop * w)


def _forward_block(q, kr, vr, kpr, out, lse, bs, hs, rows, mask) -> bool:
    """One block of the forward pass into ``out`` and ``lse``; whether the kernel gave a log-sum-exp."""
    m = mask[None]  # (1, nh, nr, L): one bias for the batch
    if kpr is not None:
        m = m.expand(bs.stop - bs.start, -1, -1, -1).masked_fill(kpr[bs, None, None, :], float("-inf"))
    o, part = _sdpa(q[bs, hs, rows], kr[bs, hs], vr[bs, hs], m.to(q.dtype))
    out[bs, hs, rows] = o
    if part is None:
        return False
    lse[bs, hs, rows] = part
    return True


def _backward_block(q, kr, vr1, kpr, do1, lse, bias_into, bs, hs, rows, scale, wd, dq, dkr, dvr, ws):
    """Gradients of q, k, v of one block, accumulated into dq and the head-major dkr, dvr; ``vr1`` is
    [v | 1] and ``do1`` [dO | -D], so that one product gives dP - D; ``bias_into(out, shift)`` writes
    the block's bias minus ``shift``. Returns dS, heads first (a view of ``ws``).  # (nh, nb, nr, L)"""
    nb, nh, nr = bs.stop - bs.start, hs.stop - hs.start, rows.stop - rows.start
    d = q.shape[-1]
    L = kr.shape[2]
    heads_first = lambda t: t[bs, hs, rows].transpose(0, 1).to(wd).reshape(nh * nb, nr, -1)  # noqa: E731
    qc, do1c = heads_first(q), heads_first(do1)  # (nh*nb, nr, d), (nh*nb, nr, d+1)
    kc, vc1 = kr[hs, bs].reshape(nh * nb, L, d), vr1[hs, bs].reshape(nh * nb, L, -1)  # (nh*nb, L, d), (.., d+1)
    s = ws.get("scores", (nh, nb, nr, L))
    if lse is not None:  # P = exp(S - lse): the bias minus lse in one pass, then q k^T added in place
        bias_into(s, lse[bs, hs, rows, None].transpose(0, 1))
        if kpr is not None:
            s.masked_fill_(kpr[None, bs, None, :], float("-inf"))
        p = s.view(nh * nb, nr, L).baddbmm_(qc, kc.transpose(1, 2), alpha=scale).exp_()
    else:
        bias_into(s, None)
        if kpr is not None:
            s.masked_fill_(kpr[None, bs, None, :], float("-inf"))
        p = torch.softmax(s.view(nh * nb, nr, L).baddbmm_(qc, kc.transpose(1, 2), alpha=scale), dim=-1)
    ds = torch.bmm(do1c, vc1.transpose(1, 2), out=ws.get("grads", (nh * nb, nr, L)))  # dP - D
    ds.mul_(p)  # dS = P * (dP - D)
    do = do1c[..., :-1]
    if dvr is not None:
        _add_bmm(dvr[hs, bs], p.transpose(1, 2), do, 1.0)
    if dq is not None:
        dq[bs, hs, rows] = torch.bmm(ds, kc).mul_(scale).view(nh, nb, nr, d).transpose(0, 1)
    if dkr is not None:
        _add_bmm(dkr[hs, bs], ds.transpose(1, 2), qc, scale)
    return ds.view(nh, nb, nr, L)


def _backward_block_dnn(q, kr, krt, vr1, kpr, do1, lse, bias_into, bs, hs, rows, scale, dq, dkrt, dvrt, ws, take):
    """``_backward_block`` through oneDNN's matrix products, one (head, batch item) at a time (float32 on
    the CPU, where they ran faster than torch's MKL ``bmm`` for these shapes on an AMD EPYC);
    dkrt and dvrt are transposed, (heads, B, d, L); ``bias_into(out, shift, head)`` writes one head's
    bias minus ``shift``. ``take(g, head)`` receives each head's dS summed over the batch items (1, nr, L).
    At most four (nr, L) buffers live at a time: the bias, P, dS and the batch sum."""
    nb, nh, nr = bs.stop - bs.start, hs.stop - hs.start, rows.stop - rows.start
    L = kr.shape[2]
    for i in range(nh):
        hd = hs.start + i
        g = None
        for j in range(nb):
            b = bs.start + j
            s = bias_into(ws.get("scores", (1, 1, nr, L)), lse[b, hd, rows, None][None, None], hd)  # bias - lse
            if kpr is not None:
                s.masked_fill_(kpr[b, None, None, None, :], float("-inf"))
            qs = q[b, hd, rows].float().mul(scale)  # (nr, d), scaled
            do1c = do1[b, hd, rows].contiguous()  # (nr, d+1) = [dO | -D]
            p = _LINEAR.binary(qs, s[0, 0], kr[hd, b], None, "add").exp_()  # exp(S - lse)  (nr, L)
            if dvrt is not None:
                dvrt[hd, b] += _linear(do1c[:, :-1].t().contiguous(), p.t())  # dV^T += dO^T P  (d, L)
            ds = _linear(do1c, vr1[hd, b]).mul_(p)  # dS = P (dP - D)  (nr, L)
            del p
            if dq is not None:
                dq[b, hd, rows] = _linear(ds, krt[hd, b]).mul_(scale)  # dQ = scale dS K
            if dkrt is not None:
                dkrt[hd, b] += _linear(qs.t().contiguous(), ds.t())  # dK^T += scale Q^T dS
            if take is not None:
                if g is None:
                    g = ds
                elif j == 1:
                    g = torch.add(g, ds, out=ws.get("bias_grad", (nr, L)))
                else:
                    g += ds
            del ds
        if g is not None:
            take(g[None], hd)


_LINEAR = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if hasattr(torch.ops, "mkldnn") else None
_ONEDNN: list[bool] = []


def _linear(x, w):  # x @ w^T through oneDNN
    return _LINEAR(x, w, None, "none", [], "")


def onednn_linear() -> bool:
    """Whether oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, plain and ``.binary`` add) runs
    here and gives ``x @ w^T (+ other)``: checked once, on small tensors."""
    if not _ONEDNN:
        ok = False
        if _LINEAR is not None and torch.backends.mkldnn.is_available():
            try:
                x, w, o, w2 = torch.randn(3, 4), torch.randn(5, 4), torch.randn(3, 5), torch.randn(4, 5)
                ok = (torch.allclose(_linear(x, w), x @ w.t(), atol=1e-5)
                      and torch.allclose(_LINEAR.binary(x, o, w, None, "add"), x @ w.t() + o, atol=1e-5)
                      and torch.allclose(_linear(x, w2.t()), x @ w2, atol=1e-5))  # a transposed view as weight
            except (RuntimeError, TypeError):
                ok = False
        _ONEDNN.append(ok)
    return _ONEDNN[0]


def _add_bmm(dst: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float) -> None:
    """dst (nh, nb, n, m) += alpha * a @ b, in place on a contiguous slice, else through a temporary."""
    if dst.is_contiguous():
        dst.view(-1, *dst.shape[2:]).baddbmm_(a, b, alpha=alpha)
    else:
        dst += torch.bmm(a, b).mul_(alpha).view(dst.shape)
