# The anchors' PyTorch ResNet-20 (torch2_models.py) run channels last: its weights and each step's
# input in torch.channels_last, the twin of `keel bench resnet --data_format=NHWC`. Every flag is
# torch2_models.py's; ANCHORS names its folder.
#   ANCHORS=DIR python tests/bench/torch_models_channels_last.py --model resnet --amp bf16 --threads 1
import os
import sys

sys.path.insert(0, os.environ["ANCHORS"])
import torch2_models as anchor  # noqa: E402  (re-executes itself for --mkl_fake_intel)
import torch  # noqa: E402


class ChannelsLastResNet20(anchor.ResNet20):
    def __init__(self):
        super().__init__()
        self.to(memory_format=torch.channels_last)

    def forward(self, x):
        return super().forward(x.contiguous(memory_format=torch.channels_last))


anchor.ResNet20 = ChannelsLastResNet20
anchor.main()
