#!/usr/bin/env bash
# fetch-vad-model.sh DEST
#
# Puts the Silero VAD v5 network (voice activity detection on 16 kHz audio) where the
# benchmarks look for it:
#
#   DEST/vad/silero-v5/model.onnx
#
# Inputs: "input" float32 [N, S] (the frame's 512 samples after the 64 samples of the
# previous frame: S = 576 at 16 kHz, as silero-vad's OnnxWrapper and vad-web feed it),
# "state" float32 [2, N, 128] (the recurrent state, zero at the start of a stream) and
# "sr" int64 (a scalar, 16000); outputs "output" float32 [N, 1] (speech probability) and
# "stateN" float32 [2, N, 128] (the state for the next frame).
#
# It is taken from the npm package @ricky0123/vad-web (`npm pack`, then only the one file,
# package/dist/silero_vad_v5.onnx, is unpacked: no install scripts run) and checked against
# its pinned SHA-256. Idempotent: a file already in place with the pinned checksum is left
# alone. Used by `ortbus bench collision -scenario real` and `ortbus bench capacity` as a
# `raw` model.
set -euo pipefail

dest=${1:?usage: fetch-vad-model.sh DEST}
exec "$(dirname "$0")/npm-file.sh" fetch-vad-model @ricky0123/vad-web 0.0.31 package/dist/silero_vad_v5.onnx \
  2623a2953f6ff3d2c1e61740c6cdb7168133479b267dfef114a4a3cc5bdd788f "$dest/vad/silero-v5/model.onnx"
