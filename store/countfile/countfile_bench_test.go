package countfile

import "testing"

// BenchmarkCountFile measures the disk cost of keeping the count file:
// saving it (temporary file, fsync, rename, directory fsync), paid at a
// clean close and when the janitor finds a table write-quiet, and
// removing it (unlink, directory fsync), paid by the first commit after
// it was saved.
//
//	go test ./store/countfile -run XXX -bench BenchmarkCountFile
func BenchmarkCountFile(b *testing.B) {
	dir := b.TempDir()
	b.Run("save", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if err := Write(dir, int64(i)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("save+remove", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if err := Write(dir, int64(i)); err != nil {
				b.Fatal(err)
			}
			if err := Remove(dir); err != nil {
				b.Fatal(err)
			}
		}
	})
}
