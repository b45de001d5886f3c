"""A plain TensorFlow regression trained by a loop of its own: a GradientTape in a
tf.function that updates its variables itself (assign_sub), no Keras model or optimizer."""
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(3)
x = tf.constant(rng.normal(size=(256, 16)).astype("float32"))
y = tf.constant((x.numpy() @ rng.normal(size=(16, 1))).astype("float32"))
w = tf.Variable(tf.zeros((16, 1)))
b = tf.Variable(tf.zeros((1,)))


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((xb @ w + b - yb) ** 2)
    gw, gb = tape.gradient(loss, [w, b])
    w.assign_sub(0.05 * gw)
    b.assign_sub(0.05 * gb)
    return loss


for epoch in range(2):
    for i in range(0, 256, 32):
        loss = step(x[i:i + 32], y[i:i + 32])
    print("epoch %d loss %.6f" % (epoch, float(loss)))
