// Package aggregate summarises a device's numeric values per time
// bucket (count, sum, min, max, first and last per value name) from the
// blocks of the store's day tables, reading each block as little as it
// can: from its header when it lies in one bucket and overlaps no other
// block, column by column when it overlaps none, and decoded into
// readings (resolved by sequence) only when blocks overlap. Decoded
// columns and block lists may be kept in a column cache
// (store/colcache) for queries asked again.
//
// The store hands it each day table through the Table interface, which
// the package declares: the blocks of the device, their bytes after the
// store's checks, and what to do with a damaged block. The arithmetic
// is the same, to the bit, whichever way a block is read, so rollups
// built from it agree with aggregates read from the tables.
package aggregate
