"""Task-level agreement between a low-precision model's outputs and the float32 outputs."""

from __future__ import annotations

import numpy as np


def topk_agreement(reference: np.ndarray, output: np.ndarray, k: int = 5) -> tuple[float, float]:
    """(top-1 agreement, mean top-k overlap) of ``(N, classes)`` logits."""
    reference = reference.reshape(reference.shape[0], -1)
    output = output.reshape(output.shape[0], -1)
    top1 = float(np.mean(reference.argmax(-1) == output.argmax(-1)))
    k = min(k, reference.shape[-1])
    ref_k = np.argsort(-reference, axis=-1)[:, :k]
    out_k = np.argsort(-output, axis=-1)[:, :k]
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_k, out_k)])
    return top1, float(overlap)


def pixel_agreement(reference: np.ndarray, output: np.ndarray, axis: int = 1) -> float:
    """Fraction of positions whose argmax over ``axis`` (the classes) agrees."""
    return float(np.mean(reference.argmax(axis=axis) == output.argmax(axis=axis)))


def threshold_agreement(reference: np.ndarray, output: np.ndarray, threshold: float) -> float:
    """Fraction of positions on the same side of ``threshold`` (binary maps)."""
    return float(np.mean((reference > threshold) == (output > threshold)))


def keypoint_agreement(reference: np.ndarray, output: np.ndarray) -> float:
    """Fraction of ``(N, K, H, W)`` heatmaps whose peak is at the same pixel."""
    ref = reference.reshape(reference.shape[0] * reference.shape[1], -1).argmax(-1)
    out = output.reshape(output.shape[0] * output.shape[1], -1).argmax(-1)
    return float(np.mean(ref == out))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of ``(N, 4)`` and ``(M, 4)`` boxes as x1, y1, x2, y2."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=-1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float = 0.45) -> np.ndarray:
    order = np.argsort(-scores)
    keep = []
    while order.size:
        best = order[0]
        keep.append(best)
        if order.size == 1:
            break
        ious = box_iou(boxes[best:best + 1], boxes[order[1:]])[0]
        order = order[1:][ious < threshold]
    return np.array(keep, dtype=np.int64)


def decode_yolov8(output: np.ndarray, score_threshold: float = 0.25):
    """Boxes, scores and classes from a YOLOv8 ``(1, 4 + classes, anchors)`` head."""
    head = output[0].T
    centers, class_scores = head[:, :4], head[:, 4:]
    classes = class_scores.argmax(-1)
    scores = class_scores.max(-1)
    mask = scores > score_threshold
    cx, cy, w, h = centers[mask].T
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    keep = nms(boxes, scores[mask]) if mask.any() else np.zeros(0, np.int64)
    return boxes[keep], scores[mask][keep], classes[mask][keep]


def detection_agreement(reference, output, iou_threshold: float = 0.5) -> tuple[float, float]:
    """(recall of reference detections matched by class and IoU, mean IoU of the matches).

    ``reference`` and ``output`` are ``(boxes, scores, classes)``; an empty reference agrees
    fully when the output is empty too.
    """
    ref_boxes, _, ref_classes = reference
    out_boxes, _, out_classes = output
    if len(ref_boxes) == 0:
        return (1.0 if len(out_boxes) == 0 else 0.0), 1.0
    if len(out_boxes) == 0:
        return 0.0, 0.0
    ious = box_iou(ref_boxes, out_boxes)
    ious[ref_classes[:, None] != out_classes[None, :]] = 0.0
    best = ious.max(axis=1)
    matched = best >= iou_threshold
    return float(np.mean(matched)), float(best[matched].mean()) if matched.any() else 0.0


def gluon_detections(ids: np.ndarray, scores: np.ndarray, boxes: np.ndarray,
                     score_threshold: float | None = 0.5, top: int | None = None):
    """GluonCV detection outputs (ids, scores, boxes, padded with -1) to one image's detections.

    Rows with an id of -1 are padding. ``score_threshold`` (None: none) drops low scores;
    ``top`` keeps the ``top`` highest-scoring rows that remain.
    """
    ids, scores, boxes = ids.reshape(-1), scores.reshape(-1), boxes.reshape(-1, 4)
    keep = ids >= 0
    if score_threshold is not None:
        keep &= scores > score_threshold
    boxes, scores, ids = boxes[keep], scores[keep], ids[keep].astype(np.int64)
    if top is not None:
        order = np.argsort(-scores, kind="stable")[:top]
        boxes, scores, ids = boxes[order], scores[order], ids[order]
    return boxes, scores, ids


def row_cosines(reference: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of two ``(N, ...)`` arrays (flattened per row); a pair of
    zero rows counts as 1."""
    ref = reference.reshape(reference.shape[0], -1).astype(np.float64)
    out = output.reshape(output.shape[0], -1).astype(np.float64)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1)
    dots = np.sum(ref * out, axis=1)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 1.0)


def next_token_agreement(reference: np.ndarray, output: np.ndarray) -> tuple[float, float]:
    """(top-1 agreement, mean top-5 overlap) of next-token logits ``(..., vocabulary)`` over
    every position."""
    vocabulary = reference.shape[-1]
    return topk_agreement(reference.reshape(-1, vocabulary), output.reshape(-1, vocabulary))
