package io.statekit.spark;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.zip.CRC32;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * The key group of a key, as statekit's Python computes it: Flink's {@code murmurHash} of the
 * CRC-32 of the key's canonical bytes, modulo the max parallelism.
 *
 * <p>The routing's SQL expression computes the same, in a dozen projected steps whose analysis
 * costs the driver tens of milliseconds every micro-batch; this is one opaque call. A null key
 * has no key group (null).
 */
public final class KeyGroups {
  private KeyGroups() {}

  /** The key group of {@code key} (a string column, as its UTF-8 bytes): an int column. */
  public static Column ofString(Column key, int maxParallelism) {
    UserDefinedFunction f = functions.udf(new OfBytes(maxParallelism), DataTypes.IntegerType);
    return f.apply(key.cast(DataTypes.BinaryType));
  }

  /** The key group of {@code key} (an integral column, as 8 bytes little-endian): an int column. */
  public static Column ofLong(Column key, int maxParallelism) {
    UserDefinedFunction f = functions.udf(new OfLong(maxParallelism), DataTypes.IntegerType);
    return f.apply(key.cast(DataTypes.LongType));
  }

  /** Flink's {@code MathUtils.murmurHash(int)}: non-negative. */
  static int murmur(int code) {
    code *= 0xcc9e2d51;
    code = Integer.rotateLeft(code, 15);
    code *= 0x1b873593;
    code = Integer.rotateLeft(code, 13);
    code = code * 5 + 0xe6546b64;
    code ^= 4;
    code ^= code >>> 16;
    code *= 0x85ebca6b;
    code ^= code >>> 13;
    code *= 0xc2b2ae35;
    code ^= code >>> 16;
    if (code >= 0) {
      return code;
    }
    return code != Integer.MIN_VALUE ? -code : 0;
  }

  static int keyGroup(byte[] bytes, int maxParallelism) {
    CRC32 crc = new CRC32();
    crc.update(bytes, 0, bytes.length);
    return murmur((int) crc.getValue()) % maxParallelism;
  }

  /** The key group of a key's bytes. */
  static final class OfBytes implements UDF1<byte[], Integer> {
    private static final long serialVersionUID = 1L;
    private final int maxParallelism;

    OfBytes(int maxParallelism) {
      this.maxParallelism = maxParallelism;
    }

    @Override
    public Integer call(byte[] bytes) {
      return bytes == null ? null : keyGroup(bytes, maxParallelism);
    }
  }

  /** The key group of a long, serialized as statekit's IntSerializer does (8 bytes little-endian). */
  static final class OfLong implements UDF1<Long, Integer> {
    private static final long serialVersionUID = 1L;
    private final int maxParallelism;

    OfLong(int maxParallelism) {
      this.maxParallelism = maxParallelism;
    }

    @Override
    public Integer call(Long value) {
      if (value == null) {
        return null;
      }
      byte[] bytes = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(value).array();
      return keyGroup(bytes, maxParallelism);
    }
  }
}
