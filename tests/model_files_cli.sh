#!/usr/bin/env bash
# model_files_cli.sh MESHSCOPE IMAGE_CLASSIFIER: bad model and data files given to the command
# line each end with one line naming the file and the problem, and exit 2 (never a crash or a
# hang): ONNX files truncated, not a protobuf, with an unknown operator, a dynamic dim or a
# float64 input; data files truncated, of a wrong dtype, with huge dims, with a label count
# that does not match, or without the field the model takes.
set -u
bin=$1 example=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# expect NAME WANTED-TEXT COMMAND...: exit 2, one line on stderr, holding WANTED-TEXT
expect() {
  local name=$1 want=$2
  shift 2
  local rc lines
  timeout 60 "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(grep -c . "$tmp/err")
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL $name (exit $rc, $lines lines): wanted '$want' in:"
    head -5 "$tmp/err"
    fail=1
  else
    echo "ok   $name: $(cat "$tmp/err")"
  fi
}

# --- ONNX models: written by hand (a protobuf is a tag, a length and bytes), no fixtures ----
# A ModelProto with ir_version 8, an opset import and a graph with one node of op_type OP,
# input "x" [N, 4] of elem type ET (1 float, 11 double), N symbolic or 2.
model() { # OP ET DIM0 -> stdout
  python3 - "$@" <<'PY'
import sys
def varint(n):
    out = b""
    while True:
        b = n & 0x7F; n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n: return out
def field(no, payload): return varint(no << 3 | 2) + varint(len(payload)) + payload
def vint(no, n): return varint(no << 3) + varint(n)
op, et, dim0 = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d0 = field(2, dim0.encode()) if not dim0.isdigit() else vint(1, int(dim0))
shape = field(1, d0) + field(1, vint(1, 4))
ttype = field(1, vint(1, et) + field(2, shape))
x = field(1, b"x") + field(2, ttype)
y = field(1, b"y") + field(2, field(1, vint(1, et)))
node = field(1, b"x") + field(2, b"y") + field(3, b"n0") + field(4, op.encode())
graph = field(1, node) + field(2, b"g") + field(11, x) + field(12, y)
model = vint(1, 8) + field(8, vint(2, 13)) + field(7, graph)
sys.stdout.buffer.write(model)
PY
}
model Relu 1 batch >"$tmp/ok.onnx"
head -c 20 "$tmp/ok.onnx" >"$tmp/truncated.onnx"
printf 'this is not a protobuf at all' >"$tmp/garbage.onnx"
model FancyOp 1 batch >"$tmp/unknown.onnx"
model Relu 11 batch >"$tmp/f64.onnx"
model Relu 1 2 >"$tmp/static.onnx"

train=("$bin" train --steps 1 --batch 2)
expect "onnx truncated" "truncated.onnx" "${train[@]}" --model "$tmp/truncated.onnx" --data x
expect "onnx garbage" "garbage.onnx" "${train[@]}" --model "$tmp/garbage.onnx" --data x
expect "onnx unknown operator" "FancyOp" "${train[@]}" --model "$tmp/unknown.onnx" --data x
expect "onnx float64" "float64" "${train[@]}" --model "$tmp/f64.onnx" --data x
expect "onnx no batch dim" "batch" "${train[@]}" --model "$tmp/static.onnx" --data x
expect "onnx no loss" "no scalar output" "${train[@]}" --model "$tmp/ok.onnx" --data x
expect "onnx --loss unknown" "no graph output named nope" "${train[@]}" --model "$tmp/ok.onnx" \
  --loss nope --data x

# --- data files for the image classifier (inputs image [3, 16, 16] and label) -------------
npy() { # FILE DESCR SHAPE BYTES: a .npy v1 with that header and BYTES bytes of data
  python3 - "$@" <<'PY'
import sys
path, descr, shape, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode() + b"\0" * n)
PY
}
npy "$tmp/short.npy" '<f4' '(4, 3, 16, 16)' 100
npy "$tmp/complex.npy" '<c8' '(4, 3, 16, 16)' $((4 * 768 * 8))
npy "$tmp/huge.npy" '<f4' '(1099511627776, 1099511627776)' 64
"$example" make-data "$tmp/ok.st" --samples 8 >/dev/null
python3 - "$tmp" <<'PY'
import json, struct, sys
tmp = sys.argv[1]
def st(path, tensors):
    hdr, off, data = {}, 0, b""
    for name, shape in tensors:
        n = 4
        for d in shape: n *= d
        hdr[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n; data += b"\0" * n
    h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
st(tmp + "/labels.st", [("image", [8, 3, 16, 16]), ("label", [7])])
st(tmp + "/nofield.st", [("image", [8, 3, 16, 16]), ("labels", [8])])
PY
ex=("$example" train --steps 1 --batch 2)
expect "data truncated" "short.npy" "${ex[@]}" --data "$tmp/short.npy"
expect "data wrong dtype" "complex" "${ex[@]}" --data "$tmp/complex.npy"
expect "data huge dims" "huge.npy" "${ex[@]}" --data "$tmp/huge.npy"
expect "data label count" "label" "${ex[@]}" --data "$tmp/labels.st"
expect "data missing field" "no field \"label\"" "${ex[@]}" --data "$tmp/nofield.st"
expect "data missing file" "nowhere.st" "${ex[@]}" --data "$tmp/nowhere.st"
exit $fail
