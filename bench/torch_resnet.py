#!/usr/bin/env python3
"""The same ResNet-18 training step as bench/resnet_step.cc, in PyTorch (Debian python3-torch, CPU).

Hugging Face ResNet structure (configs/models/resnet18.json): 7x7/2 stem conv + batch norm + ReLU
+ 3x3/2 max pool, 4 stages of basic layers [2, 2, 2, 2] with [64, 128, 256, 512] channels (the
first layer of stages 2-4 has stride 2 and a 1x1 conv + batch norm projection shortcut), global
average pool, linear classifier. Convolutions have no bias. float32, NCHW, cross entropy,
SGD with momentum 0.9 (no weight decay), as meshflow's step.
Usage: /usr/bin/python3 bench/torch_resnet.py --threads 2 --steps 10
"""
import argparse, json, time
import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin, cout, k, stride):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class BasicLayer(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.shortcut = conv_bn(cin, cout, 1, stride) if cin != cout or stride != 1 else None
        self.conv0 = conv_bn(cin, cout, 3, stride)
        self.conv1 = conv_bn(cout, cout, 3, 1)

    def forward(self, x):
        h = self.conv1(F.relu(self.conv0(x)))
        return F.relu(h + (self.shortcut(x) if self.shortcut is not None else x))


class ResNet(nn.Module):
    def __init__(self, channels=3, embedding=64, hidden=(64, 128, 256, 512), depths=(2, 2, 2, 2),
                 labels=10):
        super().__init__()
        self.embedder = nn.Sequential(conv_bn(channels, embedding, 7, 2), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
        layers, cin = [], embedding
        for i, (h, d) in enumerate(zip(hidden, depths)):
            for j in range(d):
                layers.append(BasicLayer(cin, h, 2 if j == 0 and i > 0 else 1))
                cin = h
        self.encoder = nn.Sequential(*layers)
        self.classifier = nn.Linear(cin, labels)
        for mod in self.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.encoder(self.embedder(x))
        return self.classifier(x.mean(dim=(2, 3)))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(threads=1, steps=10, batch=32, image=32, labels=10).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--channels_last", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = ResNet(labels=a.labels)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(a.batch, 3, a.image, a.image) * 2 - 1
    y = torch.randint(0, a.labels, (a.batch,))
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    el = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "threads": a.threads,
                      "mkldnn": torch.backends.mkldnn.is_available()
                      and torch.backends.mkldnn.enabled,
                      "channels_last": bool(a.channels_last),
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "images_per_s": round(a.batch * a.steps / el, 1),
                      "step_ms": round(1e3 * el / a.steps, 2), "loss": round(loss, 4)}))


if __name__ == "__main__":
    main()
