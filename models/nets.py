"""Network definitions. All spatial models are fully convolutional (valid padding, no spatial
stride/pooling, no normalisation layers), so the patch model and the dense twin share weights
and give the same per-pixel outputs. (GroupNorm/BatchNorm would normalise over the spatial
extent and break patch/dense equivalence, so none is used.)"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class HybridSN(nn.Module):
    """HybridSN-style: in-graph band reduction (learned 1x1 projection, PCA-initialised),
    three 3-D convs, one '2-D' conv over (channels x remaining spectral depth) implemented as a
    Conv3d whose kernel spans the whole spectral depth (identical to HybridSN's reshape + Conv2d),
    and a classifier conv covering the remaining 3x3 spatial extent. Patch 11 -> 1x1."""

    def __init__(self, bands=204, k=6, d=20, drop=0.2):
        super().__init__()
        self.proj = nn.Conv3d(1, d, (bands, 1, 1))
        self.c1 = nn.Conv3d(1, 8, (7, 3, 3))
        self.c2 = nn.Conv3d(8, 8, (5, 3, 3))
        self.c3 = nn.Conv3d(8, 16, (3, 3, 3))
        depth = d - 6 - 4 - 2
        self.c4 = nn.Conv3d(16, 32, (depth, 3, 3))
        self.drop = nn.Dropout(drop)
        self.cls = nn.Conv3d(32, k, (1, 3, 3))
        self.patch = 11

    def forward(self, x):  # N x 1 x C x H x W
        x = self.proj(x).transpose(1, 2)  # N x 1 x d x H x W
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        x = F.relu(self.c3(x))
        x = F.relu(self.c4(x))
        return self.cls(self.drop(x)).squeeze(2)  # N x K x (H-10) x (W-10)


class CNN3D(nn.Module):
    """Light 3-D CNN after Hamida et al. / Li et al.: spectral strides only, patch 7 -> 1x1."""

    def __init__(self, bands=204, k=6, drop=0.2):
        super().__init__()
        self.c1 = nn.Conv3d(1, 8, (9, 3, 3), stride=(3, 1, 1))
        self.c2 = nn.Conv3d(8, 16, (5, 3, 3), stride=(2, 1, 1))
        self.c3 = nn.Conv3d(16, 24, (3, 3, 3), stride=(2, 1, 1))
        d = (bands - 9) // 3 + 1
        d = (d - 5) // 2 + 1
        d = (d - 3) // 2 + 1
        self.drop = nn.Dropout(drop)
        self.cls = nn.Conv3d(24, k, (d, 1, 1))
        self.patch = 7

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        x = F.relu(self.c3(x))
        return self.cls(self.drop(x)).squeeze(2)


class Spectral1D(nn.Module):
    """Per-pixel 1-D spectral CNN after Hu et al. (2015). Input N x C."""

    def __init__(self, bands=204, k=6, drop=0.2):
        super().__init__()
        self.c1 = nn.Conv1d(1, 20, 11)
        self.c2 = nn.Conv1d(20, 32, 5)
        L = ((bands - 10) // 3 - 4) // 3
        self.fc1 = nn.Linear(32 * L, 64)
        self.drop = nn.Dropout(drop)
        self.fc2 = nn.Linear(64, k)
        self.patch = 1

    def forward(self, x):
        x = x.unsqueeze(1)
        x = F.max_pool1d(F.relu(self.c1(x)), 3)
        x = F.max_pool1d(F.relu(self.c2(x)), 3)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(self.drop(x))


class UnmixMLP(nn.Module):
    """Per-pixel abundance estimator; softmax head -> non-negative, sum-to-one."""

    def __init__(self, bands, k, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(bands, hidden), nn.ReLU(), nn.Linear(hidden, 32), nn.ReLU(),
                                 nn.Linear(32, k))
        self.patch = 1

    def forward(self, x):
        return torch.softmax(self.net(x), dim=1)


class PatchHead(nn.Module):
    """Patch model: N x 1 x C x p x p -> N x K (squeezes the 1x1 spatial output)."""

    def __init__(self, core):
        super().__init__()
        self.core = core

    def forward(self, x):
        return torch.flatten(self.core(x), 1)
