"""fastai's batch transforms rebuilt in PyTorch for tests/test_transforms.c.

    transforms.py DIR affine pad=reflection|zeros|border
        in:  img (N, C, H, W), draws (N, 10): flip, dihedral, rotate_deg, zoom (fastai's s),
             col_pct, row_pct, warp_x, warp_y, brightness, contrast; opts (2): flip_vert, unused
        out: mat (N, 2, 3) from fastai's flip_mat/dihedral_mat @ rotate_mat @ zoom_mat and
             _prepare_mat; coeffs (N, 8) from find_coeffs; out (N, C, H, W) = lighting applied to
             grid_sample(img, apply_perspective(affine_grid(mat)), bilinear, pad, corners)
    transforms.py DIR pad  mode=reflect|constant|replicate p=L,R,T,B
        in: img (C, H, W); out: F.pad(img, (L, R, T, B), mode)

The formulas follow fastai/vision/augment.py (flip_mat, dihedral_mat, rotate_mat, zoom_mat,
_prepare_mat, _WarpCoord, find_coeffs, apply_perspective, _BrightnessLogit, _ContrastLogit,
logit); fastai itself is not needed."""
import math
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import common  # noqa: E402

d = common.folder()
what = sys.argv[2]
args = dict(a.split("=", 1) for a in sys.argv[3:])


def affine_mat(*ms):
    return torch.stack([torch.stack([ms[0], ms[1], ms[2]], dim=1),
                        torch.stack([ms[3], ms[4], ms[5]], dim=1),
                        torch.stack([ms[6], ms[7], ms[8]], dim=1)], dim=1)


def find_coeffs(p1, p2):
    m = []
    p = p1[:, 0, 0]
    t0, t1 = torch.zeros_like(p), torch.ones_like(p)
    for i in range(p1.shape[1]):
        m.append(torch.stack([p2[:, i, 0], p2[:, i, 1], t1, t0, t0, t0,
                              -p1[:, i, 0] * p2[:, i, 0], -p1[:, i, 0] * p2[:, i, 1]]))
        m.append(torch.stack([t0, t0, t0, p2[:, i, 0], p2[:, i, 1], t1,
                              -p1[:, i, 1] * p2[:, i, 0], -p1[:, i, 1] * p2[:, i, 1]]))
    A = torch.stack(m).permute(2, 0, 1)
    B = p1.reshape(p1.shape[0], 8, 1)
    return torch.linalg.solve(A, B)


def apply_perspective(coords, coeffs):
    sz = coords.shape
    coords = coords.view(sz[0], -1, 2)
    coeffs = torch.cat([coeffs, torch.ones_like(coeffs[:, :1])], dim=1).view(coeffs.shape[0], 3, 3)
    coords1 = coords @ coeffs[..., :2].transpose(1, 2) + coeffs[..., 2].unsqueeze(1)
    coords = coords1 / coords1[..., 2].unsqueeze(-1)
    return coords[..., :2].view(*sz)


def logit(x):
    x = x.clamp(1e-7, 1 - 1e-7)
    return -(1 / x - 1).log()


if what == "affine":
    img = common.tensor(d, "img")
    draws = torch.tensor(common.get(d, "draws"), dtype=torch.float64)
    flip_vert = bool(common.get(d, "opts")[0])
    n, c, h, w = img.shape
    t0, t1 = torch.zeros(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    if flip_vert:  # dihedral_mat
        idx = draws[:, 1].long()
        xs = torch.tensor([1, -1, 1, -1, -1, 1, 1, -1], dtype=torch.float64).gather(0, idx)
        ys = torch.tensor([1, 1, -1, 1, -1, -1, 1, -1], dtype=torch.float64).gather(0, idx)
        m0 = torch.tensor([1, 1, 1, 0, 1, 0, 0, 0], dtype=torch.float64).gather(0, idx)
        m1 = torch.tensor([0, 0, 0, 1, 0, 1, 1, 1], dtype=torch.float64).gather(0, idx)
        flip = affine_mat(xs * m0, xs * m1, t0, ys * m1, ys * m0, t0, t0, t0, t1)
    else:  # flip_mat
        f = draws[:, 0]
        flip = affine_mat(f, t0, t0, t0, t1, t0, t0, t0, t1)
    th = draws[:, 2] * math.pi / 180
    rot = affine_mat(th.cos(), th.sin(), t0, -th.sin(), th.cos(), t0, t0, t0, t1)
    s = draws[:, 3]
    col_c = (1 - s) * (2 * draws[:, 4] - 1)
    row_c = (1 - s) * (2 * draws[:, 5] - 1)
    zoom = affine_mat(s, t0, col_c, t0, s, row_c, t0, t0, t1)
    mat = flip @ rot @ zoom
    mat[:, 0, 1] *= h / w
    mat[:, 1, 0] *= w / h
    mat = mat[:, :2]
    common.put(d, "mat", mat.numpy())
    x_t, y_t = draws[:, 6:7], draws[:, 7:8]
    orig = torch.tensor([[-1, -1], [-1, 1], [1, -1], [1, 1]],
                        dtype=torch.float64).unsqueeze(0).expand(n, 4, 2)
    targ = torch.stack([torch.cat([-1 - y_t, -1 - x_t], dim=1), torch.cat([-1 + y_t, 1 + x_t], dim=1),
                        torch.cat([1 + y_t, -1 + x_t], dim=1), torch.cat([1 - y_t, 1 - x_t], dim=1)],
                       dim=1)
    coeffs = find_coeffs(orig, targ)
    common.put(d, "coeffs", coeffs.reshape(n, 8).numpy())
    coords = F.affine_grid(mat.float(), (n, c, h, w), align_corners=True)
    coords = apply_perspective(coords, coeffs.float())
    out = F.grid_sample(img, coords, mode="bilinear", padding_mode=args["pad"], align_corners=True)
    b = draws[:, 8].float()[:, None, None, None]
    k = draws[:, 9].float()[:, None, None, None]
    lit = torch.sigmoid((logit(out) + logit(b)) * k)
    has = ((draws[:, 8] != 0.5) | (draws[:, 9] != 1)).view(n, 1, 1, 1)
    common.put(d, "out", torch.where(has, lit, out).numpy())
elif what == "pad":
    img = common.tensor(d, "img")
    p = [int(v) for v in args["p"].split(",")]
    common.put(d, "out", F.pad(img.unsqueeze(0), tuple(p), mode=args["mode"])[0].numpy())
