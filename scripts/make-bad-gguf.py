#!/usr/bin/env python3
"""Writes the corpus of malformed GGUF files used by tests/model/test_gguf_parse.c.

    python3 scripts/make-bad-gguf.py                 # -> tests/data/gguf-bad/
    python3 scripts/make-bad-gguf.py --seeds DIR     # bad files + valid ones (fuzzer seeds)

Each bad file differs from a small valid file in one way; tests/model/test_gguf_parse.c
keeps the table of file name -> expected substring of the error message.
Development-time only: the tests read the committed files, not this script.
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q4_0, T_Q8_0 = 0, 1, 2, 8


def p32(v):
    return struct.pack('<I', v)


def p64(v):
    return struct.pack('<Q', v)


def gstr(b):
    if isinstance(b, str):
        b = b.encode()
    return p64(len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + p32(vtype) + payload


def kv_str(key, val):
    return kv(key, STRING, gstr(val))


def tinfo(name, ne, ttype, off):
    return gstr(name) + p32(len(ne)) + b''.join(p64(d) for d in ne) + p32(ttype) + p64(off)


def gguf(kvs, tis, data=b'', version=3, magic=b'GGUF', align=32, n_kv=None, n_t=None):
    head = magic + p32(version) + p64(len(tis) if n_t is None else n_t) + p64(len(kvs) if n_kv is None else n_kv)
    body = head + b''.join(kvs) + b''.join(tis)
    if data:
        body += b'\0' * (-len(body) % align)
    return body + data


ARCH = kv_str('general.architecture', 'llama')
DATA32 = struct.pack('<8f', *range(8))  # one f32 tensor [8]


def base(**kw):
    return gguf([ARCH], [tinfo('a', [8], T_F32, 0)], DATA32, **kw)


def bad_files():
    f = {}
    f['empty.gguf'] = b''
    f['bad-magic.gguf'] = base(magic=b'GGML')
    f['bad-version.gguf'] = base(version=4)
    f['version-1.gguf'] = base(version=1)
    # Big-endian writer: version and counts byte-swapped.
    f['big-endian.gguf'] = b'GGUF' + struct.pack('>IQQ', 3, 0, 1) + struct.pack('>Q', 1) + b'x' + struct.pack('>I', U8) + b'\1'
    f['huge-kv-count.gguf'] = gguf([ARCH], [], n_kv=1 << 60)
    f['huge-tensor-count.gguf'] = gguf([ARCH], [], n_t=1 << 60)
    f['huge-key-length.gguf'] = gguf([p64(1 << 63) + b'general.name' + p32(U8) + b'\0'], [])
    f['huge-string-length.gguf'] = gguf([kv('general.name', STRING, p64(1 << 60) + b'abc')], [])
    f['truncated-key.gguf'] = gguf([p64(20) + b'general.na'], [])
    f['empty-key.gguf'] = gguf([kv('', U32, p32(1))], [])
    f['unknown-value-type.gguf'] = gguf([kv('general.x', 13, p32(0))], [])
    f['bad-array-type.gguf'] = gguf([kv('general.x', ARRAY, p32(42) + p64(1) + p32(0))], [])
    f['nested-array.gguf'] = gguf([kv('general.x', ARRAY, p32(ARRAY) + p64(1 << 62) + p32(U8) + p64(1 << 62))], [])
    f['huge-array.gguf'] = gguf([kv('general.x', ARRAY, p32(U32) + p64(1 << 61) + p32(7))], [])
    f['huge-string-array.gguf'] = gguf([kv('tokenizer.ggml.tokens', ARRAY, p32(STRING) + p64(1 << 40) + gstr('a'))], [])
    f['duplicate-key.gguf'] = gguf([ARCH, kv(b'general.name', U8, b'\0'), kv_str('general.architecture', 'qwen2')], [])
    al = lambda v: kv('general.alignment', U32, p32(v))
    f['alignment-zero.gguf'] = gguf([al(0)], [tinfo('a', [8], T_F32, 0)], DATA32)
    f['alignment-three.gguf'] = gguf([al(3)], [tinfo('a', [8], T_F32, 0)], DATA32)
    f['alignment-type.gguf'] = gguf([kv('general.alignment', U64, p64(32))], [tinfo('a', [8], T_F32, 0)], DATA32)
    f['huge-ndims.gguf'] = gguf([ARCH], [gstr('a') + p32(0x7fffffff) + p64(8) * 4 + p32(T_F32) + p64(0)], DATA32)
    f['zero-dim.gguf'] = gguf([ARCH], [tinfo('a', [8, 0], T_F32, 0)], DATA32)
    f['negative-dim.gguf'] = gguf([ARCH], [tinfo('a', [8, (1 << 64) - 1], T_F32, 0)], DATA32)
    f['dim-overflow.gguf'] = gguf([ARCH], [tinfo('a', [1 << 32, 1 << 32], T_F32, 0)], DATA32)
    f['unknown-tensor-type.gguf'] = gguf([ARCH], [tinfo('a', [8], 99, 0)], DATA32)
    f['block-size.gguf'] = gguf([ARCH], [tinfo('a', [48], T_Q4_0, 0)], b'\0' * 64)
    f['tensor-out-of-bounds.gguf'] = gguf([ARCH], [tinfo('a', [8], T_F32, 0), tinfo('b', [8], T_F32, 32)], DATA32)
    f['misaligned-offset.gguf'] = gguf([ARCH], [tinfo('a', [4], T_F32, 4)], DATA32)
    f['overlapping-tensors.gguf'] = gguf([ARCH], [tinfo('a', [8], T_F32, 0), tinfo('b', [16], T_F32, 0)], DATA32 * 2)
    f['duplicate-tensor.gguf'] = gguf([ARCH], [tinfo('a', [8], T_F32, 0), tinfo('a', [8], T_F32, 32)], DATA32 * 2)
    return f


def valid_files():
    """A few small valid files covering every value type (fuzzer seeds)."""
    every = [
        kv('t.u8', U8, b'\xff'), kv('t.i8', I8, b'\x80'), kv('t.u16', U16, struct.pack('<H', 65535)),
        kv('t.i16', I16, struct.pack('<h', -2)), kv('t.u32', U32, p32(7)), kv('t.i32', I32, struct.pack('<i', -7)),
        kv('t.f32', F32, struct.pack('<f', 1.5)), kv('t.bool', BOOL, b'\1'), kv_str('t.str', 'hello'),
        kv('t.u64', U64, p64(1 << 40)), kv('t.i64', I64, struct.pack('<q', -(1 << 40))),
        kv('t.f64', F64, struct.pack('<d', 2.25)),
        kv('t.arr_str', ARRAY, p32(STRING) + p64(3) + gstr('a') + gstr('') + gstr('\0b')),
        kv('t.arr_i32', ARRAY, p32(I32) + p64(2) + struct.pack('<ii', -1, 5)),
        kv('t.arr_f32', ARRAY, p32(F32) + p64(2) + struct.pack('<ff', 0.5, -3)),
        kv('t.arr_empty', ARRAY, p32(U8) + p64(0)),
    ]
    q8 = (struct.pack('<H', 0x3c00) + bytes(range(32)))  # one Q8_0 block, d = 1
    tis = [tinfo('w.q8', [32, 1], T_Q8_0, 0), tinfo('w.f16', [4, 2], T_F16, 64)]
    data = q8 + b'\0' * (64 - len(q8)) + b'\0\x3c' * 8
    return {
        'valid-every-type.gguf': gguf(every, tis, data),
        'valid-aligned64.gguf': gguf([kv('general.alignment', U32, p32(64)), ARCH],
                                     [tinfo('a', [8], T_F32, 0), tinfo('b', [8], T_F32, 64)],
                                     DATA32 + b'\0' * 32 + DATA32, align=64),
        'valid-v2-no-tensors.gguf': gguf([ARCH], [], version=2),
    }


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    out, files = os.path.join(root, 'tests', 'data', 'gguf-bad'), bad_files()
    if len(sys.argv) == 3 and sys.argv[1] == '--seeds':
        out = sys.argv[2]
        files.update(valid_files())
    elif len(sys.argv) != 1:
        sys.exit(__doc__)
    os.makedirs(out, exist_ok=True)
    for name, data in sorted(files.items()):
        with open(os.path.join(out, name), 'wb') as fh:
            fh.write(data)
    print(f'{len(files)} files written to {out}')


if __name__ == '__main__':
    main()
