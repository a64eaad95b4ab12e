//! One Parquet batch file of a dataset (`dataPipeline.format: parquet`):
//! the rows of one batch as one row group, ZSTD-compressed, written with
//! the parquet crate's column writers (no Arrow).
//!
//! Schema: `task`, `variant`, `episode` (strings: an episode id is unique
//! only within its task and variant), `step` (`u32`: INT32 with the unsigned
//! 32-bit integer logical type, the row's own type, so every step a row
//! holds is stored as is and a reader gets `uint32`), `state` and `action`
//! (the values' JSON text, JSON logical type), `reward` (DOUBLE, the
//! same bits as the row's `f64`) and `truncated` (BOOLEAN: the episode has
//! no end, so its reward is unknown and `reward` is no score; a trainer
//! filters on it). Every column is required: `reward` stays a number in
//! every row, as in JSON Lines, rather than a null that would make it an
//! optional column.

use std::fs::File;
use std::io::BufWriter;
use std::sync::Arc;

use basecamp_sandbox::preprocess::Row;
use parquet::basic::{Compression, ZstdLevel};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// The columns of a training row, in order.
const SCHEMA: &str = "
message row {
  REQUIRED BYTE_ARRAY task (STRING);
  REQUIRED BYTE_ARRAY variant (STRING);
  REQUIRED BYTE_ARRAY episode (STRING);
  REQUIRED INT32 step (INTEGER(32, false));
  REQUIRED BYTE_ARRAY state (JSON);
  REQUIRED BYTE_ARRAY action (JSON);
  REQUIRED DOUBLE reward;
  REQUIRED BOOLEAN truncated;
}
";

/// The rows of one batch, held column by column until the batch is full:
/// a file is one row group, written at once.
pub struct ParquetBatch {
    file: BufWriter<File>,
    task: Vec<ByteArray>,
    variant: Vec<ByteArray>,
    episode: Vec<ByteArray>,
    step: Vec<i32>,
    state: Vec<ByteArray>,
    action: Vec<ByteArray>,
    reward: Vec<f64>,
    truncated: Vec<bool>,
}

impl ParquetBatch {
    /// A batch to be written to `file` (created by the caller, so a path
    /// that cannot be created fails as a JSON Lines batch does).
    pub fn new(file: File) -> Self {
        Self {
            file: BufWriter::new(file),
            task: Vec::new(),
            variant: Vec::new(),
            episode: Vec::new(),
            step: Vec::new(),
            state: Vec::new(),
            action: Vec::new(),
            reward: Vec::new(),
            truncated: Vec::new(),
        }
    }

    pub fn push(&mut self, row: &Row) -> Result<(), serde_json::Error> {
        self.state.push(serde_json::to_string(&row.state)?.into_bytes().into());
        self.action.push(serde_json::to_string(&row.action)?.into_bytes().into());
        self.task.push(row.task.as_bytes().to_vec().into());
        self.variant.push(row.variant.as_bytes().to_vec().into());
        self.episode.push(row.episode.as_bytes().to_vec().into());
        // The logical type says unsigned: the reader sees the u32 again.
        self.step.push(row.step as i32);
        self.reward.push(row.reward);
        self.truncated.push(row.truncated);
        Ok(())
    }

    /// Writes the row group and the footer, with `metadata` as the file's
    /// key/value metadata.
    pub fn finish(self, metadata: &[(String, String)]) -> Result<(), ParquetError> {
        let schema = Arc::new(parse_message_type(SCHEMA).expect("the row schema is valid Parquet message syntax"));
        let properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_key_value_metadata(Some(
                metadata.iter().map(|(key, value)| KeyValue::new(key.clone(), value.clone())).collect(),
            ))
            .build();
        let mut writer = SerializedFileWriter::new(self.file, schema, Arc::new(properties))?;
        let mut group = writer.next_row_group()?;
        let mut index = 0;
        while let Some(mut column) = group.next_column()? {
            // In SCHEMA's order.
            match index {
                0 => column.typed::<ByteArrayType>().write_batch(&self.task, None, None)?,
                1 => column.typed::<ByteArrayType>().write_batch(&self.variant, None, None)?,
                2 => column.typed::<ByteArrayType>().write_batch(&self.episode, None, None)?,
                3 => column.typed::<Int32Type>().write_batch(&self.step, None, None)?,
                4 => column.typed::<ByteArrayType>().write_batch(&self.state, None, None)?,
                5 => column.typed::<ByteArrayType>().write_batch(&self.action, None, None)?,
                6 => column.typed::<DoubleType>().write_batch(&self.reward, None, None)?,
                7 => column.typed::<BoolType>().write_batch(&self.truncated, None, None)?,
                _ => unreachable!("SCHEMA has eight columns"),
            };
            column.close()?;
            index += 1;
        }
        group.close()?;
        // Writes the footer and flushes the file.
        writer.close()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::basic::{LogicalType, Type as PhysicalType};
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    use serde_json::json;

    #[test]
    fn a_batch_is_one_zstd_row_group_with_the_rows_schema_and_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("batch-00000.parquet");
        let mut batch = ParquetBatch::new(File::create(&path).unwrap());
        let rows = [
            Row {
                task: "eval@step-20".into(),
                variant: "a".into(),
                episode: "ep-1".into(),
                step: u32::MAX,
                state: json!({"memory": {}}),
                action: json!({"type": "x"}),
                reward: 0.1,
                truncated: false,
            },
            Row {
                task: "eval".into(),
                variant: "b".into(),
                episode: "ep-2".into(),
                step: 0,
                state: json!({"a": [1, 2]}),
                action: json!(null),
                reward: -1.5e-300,
                truncated: true,
            },
        ];
        for row in &rows {
            batch.push(row).unwrap();
        }
        batch.finish(&[("basecamp.preprocessor".into(), "builtin:trajectory".into())]).unwrap();

        let reader = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let metadata = reader.metadata();
        assert_eq!(metadata.num_row_groups(), 1);
        let schema = metadata.file_metadata().schema_descr();
        let columns: Vec<_> = schema
            .columns()
            .iter()
            .map(|c| (c.name().to_string(), c.physical_type(), c.logical_type_ref().cloned()))
            .collect();
        assert_eq!(
            columns,
            [
                ("task".into(), PhysicalType::BYTE_ARRAY, Some(LogicalType::String)),
                ("variant".into(), PhysicalType::BYTE_ARRAY, Some(LogicalType::String)),
                ("episode".into(), PhysicalType::BYTE_ARRAY, Some(LogicalType::String)),
                ("step".into(), PhysicalType::INT32, Some(LogicalType::integer(32, false))),
                ("state".into(), PhysicalType::BYTE_ARRAY, Some(LogicalType::Json)),
                ("action".into(), PhysicalType::BYTE_ARRAY, Some(LogicalType::Json)),
                ("reward".into(), PhysicalType::DOUBLE, None),
                ("truncated".into(), PhysicalType::BOOLEAN, None),
            ]
        );
        assert!(schema.columns().iter().all(|c| c.max_def_level() == 0), "every column is required: no nulls");
        for column in metadata.row_group(0).columns() {
            assert!(matches!(column.compression(), Compression::ZSTD(_)), "{column:?}");
        }
        let kv = metadata.file_metadata().key_value_metadata().unwrap();
        assert!(
            kv.iter().any(|k| k.key == "basecamp.preprocessor" && k.value.as_deref() == Some("builtin:trajectory"))
        );
        let read: Vec<Vec<Field>> = reader
            .get_row_iter(None)
            .unwrap()
            .map(|r| r.unwrap().get_column_iter().map(|(_, f)| f.clone()).collect())
            .collect();
        assert_eq!(read[0][0], Field::Str("eval@step-20".into()));
        assert_eq!(read[1][1], Field::Str("b".into()));
        assert_eq!(read[0][3], Field::UInt(u32::MAX));
        assert_eq!(read[1][6], Field::Double(-1.5e-300));
        assert_eq!((&read[0][7], &read[1][7]), (&Field::Bool(false), &Field::Bool(true)));
        assert_eq!(read[0][4], Field::Str(r#"{"memory":{}}"#.into()));
    }
}
