package buckets

import "fmt"

// DeviceID names one device. It is a single NATS subject token, a key
// component and a URL path segment, so it must match
// ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ everywhere.
type DeviceID string

// ParseDeviceID validates s as a device ID.
func ParseDeviceID(s string) (DeviceID, error) {
	if err := DeviceID(s).Validate(); err != nil {
		return "", err
	}
	return DeviceID(s), nil
}

// Validate reports whether d matches the device ID rule. The error is a
// *ValidationError with code invalid_device.
func (d DeviceID) Validate() error {
	switch {
	case len(d) == 0:
		return invalid(CodeInvalidDevice, "device", "must not be empty")
	case len(d) > MaxDeviceIDLen:
		return invalid(CodeInvalidDevice, "device", "%d characters is longer than %d", len(d), MaxDeviceIDLen)
	case !isAlnum(d[0]):
		return invalid(CodeInvalidDevice, "device", "%q must start with a letter or digit", string(d))
	}
	for i := 1; i < len(d); i++ {
		if c := d[i]; !isAlnum(c) && c != '_' && c != '-' {
			return invalid(CodeInvalidDevice, "device", "%q has %s at byte %d; only A-Z a-z 0-9 _ - are allowed", string(d), quoteByte(c), i)
		}
	}
	return nil
}

// ValidateValueName reports whether name matches
// ^[A-Za-z_][A-Za-z0-9_.-]{0,63}$.
func ValidateValueName(name string) error {
	switch {
	case len(name) == 0:
		return invalid(CodeInvalidName, "values", "a value name must not be empty")
	case len(name) > MaxValueNameLen:
		return invalid(CodeInvalidName, "values."+name[:16]+"...", "name of %d characters is longer than %d", len(name), MaxValueNameLen)
	case !isAlpha(name[0]) && name[0] != '_':
		return invalid(CodeInvalidName, "values."+name, "name must start with a letter or _")
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !valueNameByte[c] {
			return invalid(CodeInvalidName, "values."+name, "name has %s at byte %d; only A-Z a-z 0-9 _ . - are allowed", quoteByte(c), i)
		}
	}
	return nil
}

// valueNameByte tells the bytes a value name may hold after its first.
var valueNameByte = func() (t [256]bool) {
	for c := range 256 {
		b := byte(c)
		t[c] = isAlnum(b) || b == '_' || b == '.' || b == '-'
	}
	return t
}()

func isAlpha(c byte) bool { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') }
func isAlnum(c byte) bool { return isAlpha(c) || (c >= '0' && c <= '9') }

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
