// Benchmark Parquet generator. Run: cd /tmp/parquet-bench && node gen.mjs [regex-of-file-names]
// node_modules is a symlink to /tmp/pq-gen/node_modules (@duckdb/node-api 1.5.6, parquet-wasm 0.8.0).
// Data is deterministic: derived from hash()/md5() of row indices (no random()).
import fs from 'fs';
import { DuckDBInstance } from '@duckdb/node-api';
import * as pw from 'parquet-wasm/node';

const OUT = '/tmp/parquet-bench';
const only = process.argv[2] ? new RegExp(process.argv[2]) : null;
const c = await (await DuckDBInstance.create(':memory:')).connect();
const HF_META = '{"info": {"features": {"image": {"_type": "Image"}, "label": {"names": ["0","1","2","3","4","5","6","7","8","9"], "_type": "ClassLabel"}}}}';
const sq = (s) => `'${s.replace(/'/g, "''")}'`;
const tokensSql = (lo, hi) => `SELECT list_transform(range(2048), x -> (hash(i * 2048 + x) % 50001)::INTEGER) AS input_ids FROM range(${lo}, ${hi}) r(i)`;

const jobs = {
  // ~10000 rows x 20..60 KB incompressible blobs (hex md5 chain -> unhex) = ~400 MB
  images_snappy: () => c.run(`COPY (
      SELECT {'bytes': unhex(left(array_to_string(list_transform(range((n + 15) // 16), x -> md5(i::VARCHAR || '-' || x::VARCHAR)), ''), 2 * n)),
              'path': 'img_' || lpad(i::VARCHAR, 6, '0') || '.jpg'} AS image,
             (hash(i + 7) % 10)::BIGINT AS label
      FROM (SELECT i, 20000 + (hash(i) % 40001)::INTEGER AS n FROM range(10000) r(i)) ORDER BY i)
    TO '${OUT}/images_snappy.parquet' (FORMAT parquet, COMPRESSION snappy, ROW_GROUP_SIZE 2000, KV_METADATA {huggingface: ${sq(HF_META)}})`),
  // 37000 rows x 2048 int32 = 303 MB raw
  tokens_zstd: () => c.run(`COPY (${tokensSql(0, 37000)} ORDER BY i) TO '${OUT}/tokens_zstd.parquet' (FORMAT parquet, COMPRESSION zstd)`),
  small_rows: () => c.run(`COPY (
      SELECT i::BIGINT AS id, (hash(i) % 1000000007) / 1000.0 - 500000 AS x, ((hash(i + 1) % 2000001)::DOUBLE / 1000 - 1000)::FLOAT AS y,
             (hash(i + 2) % 100)::INTEGER AS label, left(md5(i::VARCHAR), 8 + (hash(i + 3) % 9)::INTEGER) AS name
      FROM range(2000000) r(i) ORDER BY i)
    TO '${OUT}/small_rows.parquet' (FORMAT parquet, COMPRESSION snappy)`),
  // parquet-wasm (arrow-rs), data page V2, snappy; PW_ROWS (default 12288) rows x 2048 int32 = ~100 MB raw.
  // Built in batches of 2048 rows (DuckDB -> temp parquet -> wasm RecordBatch -> transformParquetStream).
  tokens_pw_v2: async () => {
    const ROWS = Number(process.env.PW_ROWS || 12288), B = 2048, tmp = `${OUT}/.tmp_batch.parquet`;
    let k = 0;
    const src = new ReadableStream({
      async pull(ctl) {
        if (k * B >= ROWS) { ctl.close(); return; }
        await c.run(`COPY (${tokensSql(k * B, (k + 1) * B)} ORDER BY i) TO '${tmp}' (FORMAT parquet, COMPRESSION uncompressed)`);
        const t = pw.readParquet(new Uint8Array(fs.readFileSync(tmp)), { batchSize: B });
        for (const rb of t.recordBatches()) ctl.enqueue(rb);
        k++;
      },
    }, { highWaterMark: 0 });
    const props = new pw.WriterPropertiesBuilder().setCompression(pw.Compression.SNAPPY)
      .setWriterVersion(pw.WriterVersion.V2).setMaxRowGroupSize(B).build();
    const outStream = await pw.transformParquetStream(src, props);
    const fd = fs.openSync(`${OUT}/tokens_pw_v2.parquet`, 'w');
    for await (const chunk of outStream) fs.writeSync(fd, chunk);
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
  },
};

for (const [name, fn] of Object.entries(jobs)) {
  if (only && !only.test(name)) continue;
  const t0 = Date.now();
  await fn();
  const f = `${OUT}/${name}.parquet`;
  const fm = (await c.runAndReadAll(`SELECT num_rows, num_row_groups, created_by FROM parquet_file_metadata('${f}')`)).getRowObjectsJson()[0];
  const cm = (await c.runAndReadAll(`SELECT string_agg(DISTINCT compression, ',') codec, sum(total_uncompressed_size) unc, string_agg(DISTINCT encodings, ' | ') enc FROM parquet_metadata('${f}')`)).getRowObjectsJson()[0];
  const kv = (await c.runAndReadAll(`SELECT decode(key) k FROM parquet_kv_metadata('${f}')`)).getRows().map((r) => r[0]);
  console.log(JSON.stringify({ file: name + '.parquet', bytes: fs.statSync(f).size, rows: fm.num_rows, row_groups: fm.num_row_groups, codec: cm.codec, uncompressed_bytes: cm.unc, encodings: cm.enc, kv, created_by: fm.created_by, secs: (Date.now() - t0) / 1000, rss_mb: Math.round(process.memoryUsage().rss / 1e6) }));
}
