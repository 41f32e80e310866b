"""Real images that ship inside installed wheels, as batches for models (no downloads)."""

from __future__ import annotations

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: scikit-image sample photos in RGB (name -> loader attribute of ``skimage.data``).
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                  "immunohistochemistry", "retina", "cat")


def sample_images(count: int = 8, size: int = 224) -> np.ndarray:
    """``count`` real photos as a uint8 ``(N, size, size, 3)`` batch, cycling if needed.

    The photos are scikit-image's and scikit-learn's bundled samples, centre-cropped to a square
    and resized with Pillow's bilinear filter.
    """
    from PIL import Image  # pylint: disable=import-outside-toplevel

    if count < 1 or size < 1:
        raise ValueError(f"count and size must be positive; got count={count}, size={size}")
    photos = _photos()
    batch = np.empty((count, size, size, 3), dtype=np.uint8)
    for i in range(count):
        photo = photos[i % len(photos)]
        height, width = photo.shape[:2]
        side = min(height, width)
        top, left = (height - side) // 2, (width - side) // 2
        crop = Image.fromarray(photo[top:top + side, left:left + side])
        batch[i] = np.asarray(crop.resize((size, size), Image.BILINEAR))
    return batch


def _photos() -> list[np.ndarray]:
    import skimage.data  # pylint: disable=import-outside-toplevel

    photos = []
    for name in SKIMAGE_PHOTOS:
        loader = getattr(skimage.data, name, None)
        if loader is None:
            continue
        image = loader()
        if image.ndim == 3 and image.shape[2] >= 3:
            photos.append(np.ascontiguousarray(image[:, :, :3]).astype(np.uint8))
    try:
        from sklearn.datasets import load_sample_images  # pylint: disable=import-outside-toplevel

        photos.extend(load_sample_images().images)
    except ImportError:
        pass
    return photos


def normalize(batch: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """uint8 NHWC images to float32 NCHW, scaled to [0, 1] and normalized per channel."""
    if batch.ndim != 4 or batch.shape[-1] != 3:
        raise ValueError(f"expected an (N, H, W, 3) batch; got shape {batch.shape}")
    scaled = batch.astype(np.float32) / 255.0
    scaled = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(scaled.transpose(0, 3, 1, 2))
