"""Data files in and out: a Parquet or CSV file read by batches (``insert``), rows written as CSV,
JSON lines or Parquet as they stream (``read``, ``changes``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from coordinator.core.errors import InvalidInput
from mergetxn.cli.output import arrow_table, console, progress
from mergetxn.tools.jsonrows import stream as json_stream

#: The formats ``read`` and ``changes`` write.
READ_FORMATS = ("table", "csv", "json", "parquet")

CSV_BLOCK_BYTES = 4 << 20


def file_batches(path: Path, schema: pa.Schema, batch_rows: int) -> tuple[int | None, Iterator[pa.Table]]:
    """A Parquet or CSV file as tables of about ``batch_rows`` rows, read as they are asked for
    (never the whole file in memory), and its row count when the file says (Parquet). CSV
    columns are parsed with the table's types."""
    suffixes = [s.lower() for s in path.suffixes]
    try:
        if suffixes and suffixes[-1] in (".parquet", ".pq", ".parq"):
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)

            def parquet() -> Iterator[pa.Table]:
                for batch in pf.iter_batches(batch_size=batch_rows):
                    yield pa.Table.from_batches([batch])

            return pf.metadata.num_rows, _reading(path, parquet())
        if ".csv" in suffixes or ".tsv" in suffixes:
            import pyarrow.csv as pcsv

            delimiter = "\t" if ".tsv" in suffixes else ","
            types = {f.name: f.type for f in schema}
            reader = pcsv.open_csv(
                path,
                read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES),
                parse_options=pcsv.ParseOptions(delimiter=delimiter),
                convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True),
            )

            def csv() -> Iterator[pa.Table]:
                pending: list[pa.RecordBatch] = []
                have = 0
                for batch in reader:
                    pending.append(batch)
                    have += batch.num_rows
                    if have >= batch_rows:
                        yield pa.Table.from_batches(pending)
                        pending, have = [], 0
                if pending:
                    yield pa.Table.from_batches(pending)

            return None, _reading(path, csv())
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None
    raise InvalidInput(f"cannot tell the format of {path}: use a .parquet or .csv file")


def _reading(path: Path, tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``tables`` with a read error anywhere in the file reported as bad input."""
    try:
        yield from tables
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}") from None


def output_format(fmt: str | None, output: Path | None) -> str:
    """The format ``read`` and ``changes`` write: ``--format``, else the output file's extension
    (Parquet unless it says CSV or JSON), else a table on the terminal."""
    if fmt is None:
        if output is None:
            return "table"
        suffix = output.suffix.lower()
        return (
            "csv" if suffix in (".csv", ".tsv") else "json" if suffix in (".json", ".jsonl", ".ndjson") else "parquet"
        )
    if fmt == "table" and output is not None:
        raise InvalidInput("--format table prints to the terminal; give csv, json or parquet with --output")
    return fmt


def write_rows(
    tables: Iterator[pa.Table], schema: pa.Schema, fmt: str, output: Path | None, total: int | None = None
) -> int:
    """Write ``tables`` as they come (one in memory at a time) in ``fmt`` to ``output`` or
    stdout; the number of rows written."""
    rows = 0
    try:
        if output is None:
            sys.stdout.flush()
        sink: Any = sys.stdout.buffer if output is None else open(output, "wb")  # noqa: SIM115
    except OSError as exc:
        raise InvalidInput(f"cannot write {output}: {exc}") from None
    try:
        with progress(f"reading into {output.name}" if output is not None else "reading", total) as advance:
            if fmt in ("parquet", "csv"):
                import pyarrow.csv as pcsv
                import pyarrow.parquet as pq

                with (pq.ParquetWriter if fmt == "parquet" else pcsv.CSVWriter)(sink, schema) as writer:
                    for data in tables:
                        writer.write_table(data)
                        rows += data.num_rows
                        advance(data.num_rows)
            else:
                for chunk, n in json_stream(tables):  # vectorised, two threads (mergetxn/tools/jsonrows.py)
                    sink.write(chunk)
                    rows += n
                    advance(n)
        sink.flush()
    except BrokenPipeError:
        raise  # stdout's reader went away: not an error (MergetxnGroup.invoke)
    except (OSError, pa.ArrowException) as exc:
        raise InvalidInput(f"cannot write {output or 'stdout'}: {exc}") from None
    finally:
        if output is not None:
            sink.close()
    return rows


def print_rows(shown: pa.Table, count: int, limit: int, what: str) -> None:
    """The first rows of a result (``shown``) as a table, and how many ``what`` there are."""
    out = console()
    out.print(arrow_table(shown))
    more = f" (showing {limit})" if count > limit else ""
    out.print(f"{count} {what}{more}")


def write_out(
    tables: Iterator[pa.Table], schema: pa.Schema, fmt: str, output: Path | None, total: int | None, what: str
) -> None:
    """:func:`write_rows`, then how many ``what`` were written and where (on stderr when the
    rows went to stdout)."""
    rows = write_rows(tables, schema, fmt, output, total)
    where = f" to {output}" if output is not None else ""
    console(stderr=output is None).print(f"wrote {rows} {what}{where}")
