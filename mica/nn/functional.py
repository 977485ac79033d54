"""`import mica.nn.functional as F`, as one writes torch.nn.functional: the same verbs as `mica.`."""
from ..verbs import (  # noqa: F401
    adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d, avg_pool1d, avg_pool2d, batch_norm, dropout1d, dropout2d, dropout3d, binary_cross_entropy, binary_cross_entropy_with_logits, celu, conv1d, conv2d, conv3d,
    conv_transpose1d, conv_transpose2d, conv_transpose3d,
    cosine_similarity, cross_entropy, dropout, elu, embedding, gelu, glu, group_norm, hardshrink, hardsigmoid, interpolate,
    instance_norm, pixel_shuffle, pixel_unshuffle, margin_ranking_loss, hinge_embedding_loss, soft_margin_loss,
    cosine_embedding_loss, triplet_margin_loss, gaussian_nll_loss, poisson_nll_loss, multilabel_soft_margin_loss,
    multi_margin_loss, affine_grid, grid_sample, embedding_bag,
    hardswish, hardtanh, huber_loss, kl_div, l1_loss, layer_norm, leaky_relu, linear, log_softmax, logsigmoid,
    max_pool1d, max_pool2d, mish, mse_loss, nll_loss, normalize, one_hot, pad, pairwise_distance, prelu, relu,
    relu6, rms_norm, scaled_dot_product_attention, selu, sigmoid, silu, smooth_l1_loss, softmax, softmin, softplus,
    softshrink, softsign, tanh, tanhshrink, threshold, upsample, upsample_bilinear, upsample_nearest,
)


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(name)
    from ..errors import missing_verb

    raise missing_verb("mica.nn.functional.", name, "torch.nn.functional.")
