import numpy as np
import torch

from jagg_lab.callbacks import captioned_grid
from jagg_lab.callbacks.grids import CAPTION_WIDTH, LINE, PAD, TILE


def test_grid_has_one_row_per_prompt_group_with_captions_and_rewards():
    images = torch.zeros(6, 3, 32, 32)
    images[3:] = 1.0  # the second group is white, the first black
    grid = np.asarray(captioned_grid(images, ["a red circle", "two blue squares"], torch.arange(6.0) / 10, group_size=3))
    row = TILE + LINE + PAD
    assert grid.shape == (2 * row + PAD, CAPTION_WIDTH + 3 * (TILE + PAD) + PAD, 3)
    first_tile = grid[PAD:PAD + TILE, CAPTION_WIDTH:CAPTION_WIDTH + TILE]
    second_row_tile = grid[PAD + row:PAD + row + TILE, CAPTION_WIDTH:CAPTION_WIDTH + TILE]
    assert (first_tile == 0).all() and (second_row_tile == 255).all()
    assert (grid[PAD:PAD + LINE, PAD:CAPTION_WIDTH] < 128).any()  # the prompt is written left of its row
    assert (grid[PAD + TILE:PAD + TILE + LINE, CAPTION_WIDTH:CAPTION_WIDTH + TILE] < 128).any()  # a reward under a tile
