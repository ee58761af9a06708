// Shared: datasets (source of truth), type helpers, canonical JSON.
export const OUT = '/tmp/parquet-real';

// ---- type descriptors ----
export const T = {
  i8: { t: 'int8' }, i16: { t: 'int16' }, i32: { t: 'int32' }, i64: { t: 'int64' },
  u8: { t: 'uint8' }, u16: { t: 'uint16' }, u32: { t: 'uint32' }, u64: { t: 'uint64' },
  f16: { t: 'float16' }, f32: { t: 'float' }, f64: { t: 'double' }, bool: { t: 'bool' },
  str: { t: 'string' }, bin: { t: 'binary' }, date: { t: 'date32' },
  ts: (unit, tz = null) => ({ t: 'timestamp', unit, tz }),
  time: (unit) => ({ t: 'time', unit }),
  dec: (p, s) => ({ t: 'decimal', p, s }),
  uuid: { t: 'uuid' }, interval: { t: 'interval' }, hugeint: { t: 'hugeint' },
  list: (of) => ({ t: 'list', of }),
  fixed: (n, of) => ({ t: 'fixed_list', n, of }),
  struct: (fields) => ({ t: 'struct', fields }), // fields: [[name, type], ...]
  map: (key, value) => ({ t: 'map', key, value }),
};
export function typeStr(ty) {
  switch (ty.t) {
    case 'timestamp': return `timestamp[${ty.unit}${ty.tz ? ', tz=' + ty.tz : ''}]`;
    case 'time': return `time[${ty.unit}]`;
    case 'decimal': return `decimal(${ty.p},${ty.s})`;
    case 'list': return `list<${typeStr(ty.of)}>`;
    case 'fixed_list': return `fixed_size_list<${typeStr(ty.of)}, ${ty.n}>`;
    case 'struct': return `struct<${ty.fields.map(([n, t]) => n + ': ' + typeStr(t)).join(', ')}>`;
    case 'map': return `map<${typeStr(ty.key)}, ${typeStr(ty.value)}>`;
    case 'hugeint': return 'double (source column was DuckDB HUGEINT; DuckDB writes HUGEINT as Parquet DOUBLE)';
    default: return ty.t;
  }
}
export const VALUE_CONVENTIONS = {
  'int*/uint*': 'JSON integer literal, exact (64-bit values are written as exact digits, may exceed 2^53; parse as int64/uint64)',
  'float/double/float16': 'JSON number (values chosen exactly representable in the column type)',
  binary: '"hex:" + lowercase hex of the bytes',
  date32: 'integer days since 1970-01-01',
  timestamp: 'integer count of the unit (ms/us/ns) since 1970-01-01T00:00:00 (UTC if tz=UTC, else local/naive)',
  time: 'integer count of the unit since midnight',
  decimal: 'string with exactly `scale` fractional digits',
  uuid: 'canonical lowercase 8-4-4-4-12 string',
  interval: 'object {months, days, millis} (Parquet INTERVAL = 3 little-endian uint32)',
  list: 'JSON array (null = null list)',
  struct: 'JSON object with all fields (null = null struct)',
  map: 'JSON array of {"key": k, "value": v} entries in stored order',
};

// ---- canonical JSON (BigInt -> exact digits) ----
export function J(x, indent = 0) {
  const s = JSON.stringify(x, (k, v) => (typeof v === 'bigint' ? `__BIG__${v}` : v), indent || undefined);
  return s.replace(/"__BIG__(-?\d+)"/g, '$1');
}
export const hex = (u8) => Buffer.from(u8).toString('hex');
export const binv = (u8) => (u8 == null ? null : 'hex:' + hex(u8));

// canonical form of an expected (source) value, for comparison
export function canonExpected(ty, v) {
  if (v == null) return null;
  switch (ty.t) {
    case 'int8': case 'int16': case 'int32': case 'int64': case 'uint8': case 'uint16': case 'uint32': case 'uint64':
      return BigInt(v);
    case 'binary': return binv(v);
    case 'list': case 'fixed_list': return v.map((x) => canonExpected(ty.of, x));
    case 'struct': return Object.fromEntries(ty.fields.map(([n, t]) => [n, canonExpected(t, v[n])]));
    case 'map': return v.map(([k, val]) => ({ key: canonExpected(ty.key, k), value: canonExpected(ty.value, val) }));
    case 'hugeint': return Number(v);
    default: return v;
  }
}

// ---- datasets ----
const WORDS = ['alpha', 'beta', 'gamma', 'delta', 'épsilon', 'ζήτα', '猫', ''];
export function base50(n = 50) {
  const rows = [...Array(n).keys()];
  const i32 = rows.map((i) => (i % 7 === 3 ? null : i === 1 ? -2147483648 : i === 2 ? 2147483647 : i * 37 - 900));
  const i64 = rows.map((i) => (i % 8 === 5 ? null : i === 0 ? -9223372036854775808n : i === 1 ? 9223372036854775807n : BigInt(i) * 123456789012n - 3000000000000n));
  const f32 = rows.map((i) => (i % 11 === 4 ? null : (i - 25) * 0.375));
  const f64 = rows.map((i) => (i % 9 === 2 ? null : i * 1.1 - 3.3 + (i === 7 ? 1e300 : 0)));
  const b = rows.map((i) => (i % 5 === 4 ? null : i % 3 === 0));
  const s = rows.map((i) => (i % 6 === 1 ? null : i % 4 === 0 ? WORDS[i % 8] : `${WORDS[i % 8]}_${i}`));
  const bin = rows.map((i) => (i % 9 === 6 ? null : Uint8Array.from({ length: i % 5 }, (_, k) => (i * 31 + k * 7) & 255)));
  return {
    num_rows: n,
    columns: [
      { name: 'c_int32', type: T.i32, values: i32 },
      { name: 'c_int64', type: T.i64, values: i64 },
      { name: 'c_float', type: T.f32, values: f32 },
      { name: 'c_double', type: T.f64, values: f64 },
      { name: 'c_bool', type: T.bool, values: b },
      { name: 'c_string', type: T.str, values: s },
      { name: 'c_binary', type: T.bin, values: bin },
    ],
  };
}

// low-cardinality table: DuckDB uses dictionary (PLAIN_DICTIONARY) here
export function dictTable(n = 2000) {
  const r = [...Array(n).keys()];
  return {
    num_rows: n,
    columns: [
      { name: 'id', type: T.i64, values: r.map((i) => BigInt(i)) },
      { name: 'cat_i32', type: T.i32, values: r.map((i) => (i % 23 === 0 ? null : (i % 10) * 1000 - 3000)) },
      { name: 'cat_str', type: T.str, values: r.map((i) => (i % 29 === 0 ? null : WORDS[i % 8] + '_' + (i % 5))) },
      { name: 'cat_f64', type: T.f64, values: r.map((i) => (i % 31 === 0 ? null : (i % 6) * 0.5 - 1)) },
      { name: 'cat_bool', type: T.bool, values: r.map((i) => (i % 37 === 0 ? null : i % 4 === 0)) },
    ],
  };
}

// 1000 rows, for row-group / many-page / encoding files
export function rows1000(n = 1000) {
  const r = [...Array(n).keys()];
  return {
    num_rows: n,
    columns: [
      { name: 'id', type: T.i64, values: r.map((i) => BigInt(i)) },
      { name: 'i32', type: T.i32, values: r.map((i) => (i % 13 === 0 ? null : ((i * 7919) % 20011) - 10000)) },
      { name: 'd', type: T.f64, values: r.map((i) => (i % 17 === 0 ? null : Math.sin(i) * 1000)) },
      { name: 's', type: T.str, values: r.map((i) => (i % 19 === 0 ? null : `row-${String(i).padStart(5, '0')}-${WORDS[i % 7]}`)) },
    ],
  };
}

// Encoding-oriented table (no nulls in some columns; shared prefixes for DELTA_BYTE_ARRAY)
export function encTable(n = 200) {
  const r = [...Array(n).keys()];
  return {
    num_rows: n,
    columns: [
      { name: 'i32_sorted', type: T.i32, values: r.map((i) => i * 3 + (i % 4)) },
      { name: 'i32_random', type: T.i32, values: r.map((i) => (i % 10 === 9 ? null : ((i * 2654435761) % 4294967296) - 2147483648 | 0)) },
      { name: 'i64', type: T.i64, values: r.map((i) => (i % 10 === 8 ? null : BigInt(i) * 1000000007n - 99999999999n + (i === 3 ? 9000000000000000000n : 0n))) },
      { name: 'f32', type: T.f32, values: r.map((i) => (i % 10 === 7 ? null : (i - 100) / 16)) },
      { name: 'f64', type: T.f64, values: r.map((i) => (i % 10 === 6 ? null : Math.cos(i) * 1e6)) },
      { name: 'bool', type: T.bool, values: r.map((i) => (i % 10 === 5 ? null : (i % 7) < 3)) },
      { name: 'str_prefix', type: T.str, values: r.map((i) => (i % 10 === 4 ? null : `https://example.com/datasets/item/${String(Math.floor(i / 3)).padStart(4, '0')}/${i % 3 ? 'train' : 'test'}.jpg`)) },
      { name: 'bin', type: T.bin, values: r.map((i) => (i % 10 === 3 ? null : Uint8Array.from({ length: (i * 7) % 13 }, (_, k) => (k * 13 + i) & 255))) },
    ],
  };
}

export function f16exact() { return [0, 1, -2.5, 65504, 6.103515625e-05, null, 0.5, -1000.5, 0.0009765625, 3.140625]; }

export function typesTable() {
  return {
    num_rows: 10,
    columns: [
      { name: 'i8', type: T.i8, values: [-128, -1, 0, 1, 127, null, 42, -42, 100, -100] },
      { name: 'i16', type: T.i16, values: [-32768, -1, 0, 1, 32767, null, 1234, -1234, 300, -300] },
      { name: 'u8', type: T.u8, values: [0, 1, 127, 128, 255, null, 200, 17, 99, 254] },
      { name: 'u16', type: T.u16, values: [0, 1, 32767, 32768, 65535, null, 40000, 17, 999, 65534] },
      { name: 'u32', type: T.u32, values: [0, 1, 2147483647, 2147483648, 4294967295, null, 3000000000, 17, 99999, 4294967294] },
      { name: 'u64', type: T.u64, values: [0n, 1n, 9223372036854775807n, 9223372036854775808n, 18446744073709551615n, null, 12345678901234567890n, 17n, 4294967296n, 18446744073709551614n] },
      { name: 'date', type: T.date, values: [0, 1, -1, 19000, -719162, null, 2932896, 18262, 10957, -365] },
      { name: 'ts_ms', type: T.ts('ms'), values: [0n, 1n, -1n, 1700000000123n, -62135596800000n, null, 253402300799999n, 946684800000n, 1234567890123n, -86400000n] },
      { name: 'ts_us', type: T.ts('us'), values: [0n, 1n, -1n, 1700000000123456n, -62135596800000000n, null, 253402300799999999n, 946684800000000n, 1234567890123456n, -86400000000n] },
      { name: 'ts_ns', type: T.ts('ns'), values: [0n, 1n, -1n, 1700000000123456789n, -9000000000000000000n, null, 9000000000000000000n, 946684800000000000n, 1234567890123456789n, -86400000000000n] },
      { name: 'ts_ms_utc', type: T.ts('ms', 'UTC'), values: [0n, 1n, -1n, 1700000000123n, -62135596800000n, null, 253402300799999n, 946684800000n, 1234567890123n, -86400000n] },
      { name: 'ts_us_utc', type: T.ts('us', 'UTC'), values: [0n, 1n, -1n, 1700000000123456n, -62135596800000000n, null, 253402300799999999n, 946684800000000n, 1234567890123456n, -86400000000n] },
      { name: 'ts_ns_utc', type: T.ts('ns', 'UTC'), values: [0n, 1n, -1n, 1700000000123456789n, -9000000000000000000n, null, 9000000000000000000n, 946684800000000000n, 1234567890123456789n, -86400000000000n] },
    ],
  };
}

export const IMG = (i) => Uint8Array.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, i & 255, (i * 7) & 255, 0, 0xff]);

export function nestedTable() {
  const n = 12;
  const r = [...Array(n).keys()];
  const listInt = r.map((i) => (i % 5 === 2 ? null : i % 4 === 1 ? [] : [...Array(i % 6 + 1).keys()].map((k) => k * 10 + i)));
  const listIntNullEl = r.map((i) => (i === 4 ? null : i === 5 ? [] : [...Array(i % 4 + 1).keys()].map((k) => ((k + i) % 3 === 0 ? null : k - i))));
  const emb = r.map((i) => (i === 7 ? null : [...Array(8).keys()].map((k) => (i * 8 + k) * 0.125 - 3)));
  const ll = r.map((i) => (i === 3 ? null : i === 6 ? [] : i % 2 === 0
    ? [...Array(3).keys()].map((a) => [...Array(4).keys()].map((b) => (i * 100 + a * 10 + b) % 32767 - (i > 8 ? 40 : 0)))
    : [[i], [], [i, -i, 7], null].slice(0, (i % 4) + 1)));
  const listStr = r.map((i) => (i === 2 ? null : i === 9 ? [] : [...Array(i % 3 + 1).keys()].map((k) => (k === 1 && i % 2 ? null : WORDS[(i + k) % 8]))));
  const image = r.map((i) => (i === 8 ? null : { bytes: i === 10 ? null : IMG(i), path: i % 3 === 0 ? null : `images/${i}.png` }));
  const ns = r.map((i) => (i === 5 ? null : { a: i % 4 === 3 ? null : i * 2, b: i % 6 === 1 ? null : { c: i % 5 === 0 ? null : i + 0.25 } }));
  const mp = r.map((i) => (i === 1 ? null : i === 2 ? [] : [...Array(i % 3 + 1).keys()].map((k) => [`k${k}`, k === 2 ? null : i * 10 + k])));
  const ls = r.map((i) => (i === 0 ? null : i === 3 ? [] : [...Array(i % 3 + 1).keys()].map((k) => (k === 1 && i === 4 ? null : { x: k === 2 ? null : i + k, y: k === 0 ? `y${i}` : null }))));
  return {
    num_rows: n,
    columns: [
      { name: 'list_int32', type: T.list(T.i32), values: listInt },
      { name: 'list_int32_null_elems', type: T.list(T.i32), values: listIntNullEl },
      { name: 'embedding', type: T.fixed(8, T.f32), values: emb },
      { name: 'list_list_int16', type: T.list(T.list(T.i16)), values: ll },
      { name: 'list_string', type: T.list(T.str), values: listStr },
      { name: 'image', type: T.struct([['bytes', T.bin], ['path', T.str]]), values: image },
      { name: 'nested_struct', type: T.struct([['a', T.i32], ['b', T.struct([['c', T.f64]])]]), values: ns },
      { name: 'map_str_int32', type: T.map(T.str, T.i32), values: mp },
      { name: 'list_struct', type: T.list(T.struct([['x', T.i32], ['y', T.str]])), values: ls },
    ],
  };
}

// A chat dataset's and a detection dataset's rows (lists of structs): messages of a role and
// content (one conversation empty, one null), objects of a box and a category.
export function chatTable() {
  const n = 9;
  const r = [...Array(n).keys()];
  const roles = ['system', 'user', 'assistant'];
  const messages = r.map((i) => (i === 7 ? null : i === 5 ? [] : [...Array((i % 4) + 1).keys()].map((k) => ({
    role: roles[k === 0 ? (i % 2 ? 1 : 0) : (k % 2) + 1],
    content: k === 2 && i === 3 ? '' : `${WORDS[(i + k) % 7]} ${i}.${k} ${'·'.repeat(k)}`,
  }))));
  const objects = r.map((i) => (i % 3 === 2 ? [] : [...Array((i % 3) + 1).keys()].map((k) => ({
    bbox: [i + k, i * 2 + 0.5, 10 + k * 0.25, 20 - i],
    category: BigInt((i * 3 + k) % 5),
  }))));
  return {
    num_rows: n,
    columns: [
      { name: 'id', type: T.i64, values: r.map((i) => BigInt(1000 + i)) },
      { name: 'messages', type: T.list(T.struct([['role', T.str], ['content', T.str]])), values: messages },
      { name: 'objects', type: T.list(T.struct([['bbox', T.fixed(4, T.f32)], ['category', T.i64]])), values: objects },
    ],
  };
}

export const HF_META = '{"info": {"features": {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}}';
export function hfTable() {
  const n = 6;
  const r = [...Array(n).keys()];
  return {
    num_rows: n,
    columns: [
      { name: 'image', type: T.struct([['bytes', T.bin], ['path', T.str]]), values: r.map((i) => ({ bytes: IMG(i + 100), path: i % 2 ? null : `train/${i % 4 ? 'dog' : 'cat'}_${i}.png` })) },
      { name: 'label', type: T.i64, values: r.map((i) => BigInt(i % 2)) },
    ],
  };
}

export function largeTable(n = 100000) {
  const r = [...Array(n).keys()];
  return {
    num_rows: n,
    columns: [
      { name: 'id', type: T.i64, values: r.map((i) => BigInt(i) * 3n + 1000000000000n) },
      { name: 'name', type: T.str, values: r.map((i) => `name_${(i * 7919) % 100003}_${WORDS[i % 7]}`) },
      { name: 'value', type: T.f64, values: r.map((i) => ((i * 104729) % 1000003) / 8 - 60000) },
    ],
  };
}

export function sliceTable(tab, n) {
  return { num_rows: n, columns: tab.columns.map((c) => ({ ...c, values: c.values.slice(0, n) })) };
}
