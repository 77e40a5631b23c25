"""Position-table interpolation against timm's resampler, and its invariants."""

import pytest
import torch
from timm.layers import resample_abs_pos_embed

from vitkit import interpolate_pos_embed


@pytest.mark.parametrize("prefix", [0, 1, 2, 5])
@pytest.mark.parametrize(("old", "new"), [(14, 24), (24, 14), ((8, 12), (12, 6)), (7, (7, 9))])
@pytest.mark.parametrize("antialias", [False, True])
def test_equals_timm_resample_abs_pos_embed(prefix, old, new, antialias):
    oh, ow = (old, old) if isinstance(old, int) else old
    nh, nw = (new, new) if isinstance(new, int) else new
    table = torch.randn(1, prefix + oh * ow, 32)
    ours = interpolate_pos_embed(table, old, new, num_prefix_tokens=prefix, antialias=antialias)
    theirs = resample_abs_pos_embed(
        table, (nh, nw), (oh, ow), num_prefix_tokens=prefix, interpolation="bicubic",
        antialias=antialias,
    )
    assert ours.shape == (1, prefix + nh * nw, 32)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_identity_on_equal_grids_is_exact():
    table = torch.randn(1, 1 + 6 * 4, 16)
    assert interpolate_pos_embed(table, (6, 4), (6, 4)) is table
    flat = table[0]
    assert interpolate_pos_embed(flat, (6, 4), (6, 4)) is flat


def test_prefix_rows_are_kept_unchanged():
    table = torch.randn(1, 3 + 5 * 5, 8)
    out = interpolate_pos_embed(table, 5, 9, num_prefix_tokens=3)
    assert torch.equal(out[:, :3], table[:, :3])


def test_two_dim_tables_and_half_precision_keep_their_form():
    table = torch.randn(1 + 16, 8, dtype=torch.bfloat16)
    out = interpolate_pos_embed(table, 4, (6, 2))
    assert out.shape == (1 + 12, 8) and out.dtype == torch.bfloat16


def test_constant_patch_rows_stay_constant():
    """Bicubic interpolation of a constant image is that constant: a property, not a copy."""
    table = torch.cat([torch.zeros(1, 1, 4), torch.full((1, 9, 4), 0.25)], dim=1)
    out = interpolate_pos_embed(table, 3, (5, 7))
    torch.testing.assert_close(out[:, 1:], torch.full((1, 35, 4), 0.25))


def test_row_count_mismatch_says_what_was_expected():
    with pytest.raises(ValueError, match=r"has 50 rows but 1 prefix tokens \+ an 8x8 grid need 65"):
        interpolate_pos_embed(torch.randn(1, 50, 8), 8, 10)
    with pytest.raises(ValueError, match="positive sides"):
        interpolate_pos_embed(torch.randn(1, 65, 8), 8, (0, 3))
