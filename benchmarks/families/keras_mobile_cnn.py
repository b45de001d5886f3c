"""Family: a mobile-style CNN (MobileNetV2 inverted residuals, depthwise convolutions), in Keras."""
import keras
from keras import layers

from _keras_common import BATCHES, arguments, rng, train


def inverted(x, cin, cout, stride, expand=6):
    mid = cin * expand
    h = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(mid, 1, use_bias=False)(x)))
    h = layers.DepthwiseConv2D(3, stride, padding="same", use_bias=False)(h)
    h = layers.ReLU(6.0)(layers.BatchNormalization()(h))
    h = layers.BatchNormalization()(layers.Conv2D(cout, 1, use_bias=False)(h))
    return x + h if stride == 1 and cin == cout else h


a = arguments(__doc__, batch=32, image_size=64)
spec = [(16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1),
        (64, 96, 1), (96, 160, 2), (160, 320, 1)]
images = keras.Input((a.image_size, a.image_size, 3))
h = layers.Conv2D(16, 3, 2, padding="same", use_bias=False)(images)
h = layers.ReLU(6.0)(layers.BatchNormalization()(h))
for cin, cout, stride in spec:
    h = inverted(h, cin, cout, stride)
h = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(640, 1, use_bias=False)(h)))
h = layers.Dense(100)(layers.GlobalAveragePooling2D()(h))
model = keras.Model(images, h)
n = BATCHES * a.batch_size
x = rng().standard_normal((n, a.image_size, a.image_size, 3), dtype="float32")
y = rng().integers(0, 100, n)
train(model, x, y, a.steps, a.lr, a.batch_size)
