// Package devindex is the store's device index: what the store knows
// of every device it has seen, apart from its readings. Per device it
// keeps the first and last reading time (which tell a query which day
// tables to open), the newest value of every value name, and the
// device's attributes. The attributes are indexed twice: an attribute
// record per device (with the times that decide which later
// assignment wins) and an index entity per attribute name and value,
// kept in memory as posting lists that answer attribute matchers
// without walking every device.
//
// Everything lives in memory and in one small Badger database that the
// caller opens and closes (Load, DB) and that day drops never touch.
// Records carry a CRC-32C; Load leaves out or rebuilds what fails it,
// and Check reports it.
package devindex
