package binread_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/buckets/binread"
)

func TestReader(t *testing.T) {
	var b []byte
	b = binary.AppendUvarint(b, 5)
	b = binary.AppendUvarint(b, math.MaxUint64)
	b = binary.AppendVarint(b, math.MinInt64)
	b = append(b, 0xab, 'h', 'i')
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(math.Copysign(0, -1)))
	b = append(b, 0x80, 0x00) // a uvarint 0 in two bytes

	r := binread.NewReader(b)
	assert.Equal(t, uint64(5), r.Uvarint())
	assert.Equal(t, uint64(math.MaxUint64), r.Uvarint())
	assert.Equal(t, int64(math.MinInt64), r.Varint())
	assert.Equal(t, byte(0xab), r.Byte())
	assert.Equal(t, []byte("hi"), r.Bytes(2))
	assert.Equal(t, math.Float64bits(math.Copysign(0, -1)), math.Float64bits(r.Float64()))
	assert.Equal(t, 2, r.Len())
	assert.Equal(t, uint64(0), r.Uvarint())
	assert.False(t, r.Failed())
	assert.Equal(t, 0, r.Len())

	// Each read past the end fails the reader, and it stays failed.
	fails := map[string]func(r *binread.Reader){
		"Uvarint": func(r *binread.Reader) { assert.Zero(t, r.Uvarint()) },
		"Varint":  func(r *binread.Reader) { assert.Zero(t, r.Varint()) },
		"Byte":    func(r *binread.Reader) { assert.Zero(t, r.Byte()) },
		"Bytes":   func(r *binread.Reader) { assert.Nil(t, r.Bytes(1)) },
		"Float64": func(r *binread.Reader) { assert.Zero(t, r.Float64()) },
	}
	for name, read := range fails {
		r := binread.NewReader(nil)
		read(&r)
		assert.True(t, r.Failed(), name)
	}
	r = binread.NewReader([]byte{1, 2, 3, 4, 5, 6, 7})
	assert.Zero(t, r.Float64(), "7 bytes are no float64")
	assert.True(t, r.Failed())
	assert.Zero(t, r.Len(), "a failed reader has nothing left")
	assert.Zero(t, r.Byte())
	assert.True(t, r.Failed())

	r = binread.NewReader([]byte{1, 2})
	r.Fail()
	assert.True(t, r.Failed())
	assert.Zero(t, r.Len())
	assert.Zero(t, r.Byte(), "nothing is read after Fail")

	over := binread.NewReader(bytes.Repeat([]byte{0xff}, 10))
	assert.Zero(t, over.Uvarint(), "a uvarint past 64 bits")
	assert.True(t, over.Failed())
}
