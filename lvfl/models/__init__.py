"""Party networks that split into an encoder (embedding network h) and a head (prediction network p).

Every model is built as ``Model(input_shape, embedding_dim, num_outputs, **hyperparameters)``; see
`lvfl.models.base` for the convention and `PartyModelFactory` for how configs name a model.
"""

from lvfl.models.base import ACTIVATIONS, PartyModel, PartyModelFactory
from lvfl.models.cnn import CNN
from lvfl.models.lenet import LeNet, LeNet3
from lvfl.models.logistic import LogisticRegression
from lvfl.models.mlp import MLP
from lvfl.models.resnet import ResNet18, ResNet34, ResNet50, ResNet101
from lvfl.models.tabular import DeepFM, TabularMLP, WideDeep
from lvfl.models.vgg import VGG11, VGG16

__all__ = [
    "ACTIVATIONS",
    "CNN",
    "MLP",
    "VGG11",
    "VGG16",
    "DeepFM",
    "LeNet",
    "LeNet3",
    "LogisticRegression",
    "PartyModel",
    "PartyModelFactory",
    "ResNet18",
    "ResNet34",
    "ResNet50",
    "ResNet101",
    "TabularMLP",
    "WideDeep",
]
