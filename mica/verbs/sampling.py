"""torch.nn.functional.affine_grid and grid_sample (the spatial transformer tutorial), for 4-d
inputs: a grid of normalized (x, y) positions from an affine matrix, and an image read at those
positions, bilinearly or at the nearest pixel, outside the image zeros or its border. Written with
the verbs (a gather from the flattened image, weighted), so the gradients reach the image and the
grid as torch's do; the corners' weights are torch's arithmetic."""
from .. import dtypes
from ..tensor import fail
from .core import add, as_tensor, clamp, floor, full, ge, le, linspace, logical_and, mul, ones, round, sub, to, where, \
    zeros_like
from .nn import matmul
from .shape import expand, reshape, stack, unbind

__all__ = ["affine_grid", "grid_sample"]


def _positions(n, align_corners):
    """The n normalized centres of one dim, in [-1, 1] (torch's linspace_from_neg_one)."""
    if n <= 1:
        return full((n,), 0.0)
    ends = linspace(-1.0, 1.0, n)
    return ends if align_corners else mul(ends, (n - 1) / n)


def affine_grid(theta, size, align_corners=None):
    """torch's: [N, H, W, 2] = the base grid (x, y, 1) times theta [N, 2, 3] transposed."""
    t = as_tensor(theta)
    size = [int(s) for s in size]
    if t.dtype.kind != "float" or t.ndim != 3 or tuple(t.shape[1:]) != (2, 3) or len(size) != 4 or t.shape[0] != size[0]:
        fail(f"affine_grid: takes theta [N, 2, 3] and a size [N, C, H, W] (2-d: Mica's), got {t.value.spec!r} and "
             f"{size}")
    n, _, h, w = size
    align = bool(align_corners)
    xs = expand(reshape(_positions(w, align), (1, w)), (h, w))
    ys = expand(reshape(_positions(h, align), (h, 1)), (h, w))
    base = stack([xs, ys, ones((h, w))], -1)  # [H, W, 3]
    base = to(base, t.dtype)
    grid = matmul(reshape(base, (1, h * w, 3)), t.transpose(1, 2))  # [N, H*W, 2]
    return reshape(grid, (n, h, w, 2))


def _unnormalize(coord, size, align_corners):
    if align_corners:
        return mul(add(coord, 1.0), (size - 1) / 2)
    return sub(mul(add(coord, 1.0), size / 2), 0.5)


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """torch's: output [N, C, Ho, Wo], input [N, C, H, W] read at grid [N, Ho, Wo, 2]'s (x, y)."""
    from .positions import gather

    x, g = as_tensor(input), as_tensor(grid)
    if x.ndim != 4 or g.ndim != 4 or g.shape[-1] != 2 or g.shape[0] != x.shape[0]:
        fail(f"grid_sample: takes input [N, C, H, W] and grid [N, Ho, Wo, 2] (2-d: Mica's), got {x.value.spec!r} and "
             f"{g.value.spec!r}")
    if mode not in ("bilinear", "nearest"):
        fail(f"grid_sample: mode {mode!r} is not one Mica has; use 'bilinear' or 'nearest'")
    if padding_mode not in ("zeros", "border"):
        fail(f"grid_sample: padding_mode {padding_mode!r} is not one Mica has; use 'zeros' or 'border'")
    n, c, h, w = x.shape
    _, ho, wo, _ = g.shape
    align = bool(align_corners)
    gx, gy = unbind(to(g, x.dtype), -1)
    ix, iy = _unnormalize(gx, w, align), _unnormalize(gy, h, align)
    if padding_mode == "border":
        ix, iy = clamp(ix, 0, w - 1), clamp(iy, 0, h - 1)
    flat = reshape(x, (n, c, h * w))

    def read(px, py):
        """The input at integer positions px, py [N, Ho, Wo] (zeros outside), [N, C, Ho, Wo]."""
        inside = logical_and(logical_and(ge(px, 0), le(px, w - 1)), logical_and(ge(py, 0), le(py, h - 1)))
        index = add(mul(clamp(py, 0, h - 1), w), clamp(px, 0, w - 1))
        index = expand(reshape(to(index, dtypes.int64), (n, 1, ho * wo)), (n, c, ho * wo))
        values = reshape(gather(flat, 2, index), (n, c, ho, wo))
        return where(reshape(inside, (n, 1, ho, wo)), values, zeros_like(values))

    if mode == "nearest":
        return read(round(ix), round(iy))
    x0, y0 = floor(ix), floor(iy)
    x1, y1 = add(x0, 1.0), add(y0, 1.0)
    wx1, wy1 = sub(ix, x0), sub(iy, y0)  # (torch's: the weight of the far corner, and 1 - it of the near)
    wx0, wy0 = sub(x1, ix), sub(y1, iy)

    def weight(a, b):
        return reshape(mul(a, b), (n, 1, ho, wo))

    out = mul(read(x0, y0), weight(wx0, wy0))
    out = add(out, mul(read(x1, y0), weight(wx1, wy0)))
    out = add(out, mul(read(x0, y1), weight(wx0, wy1)))
    return add(out, mul(read(x1, y1), weight(wx1, wy1)))

