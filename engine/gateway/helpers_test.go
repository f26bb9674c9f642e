package gateway_test

import "encoding/base64"

func mustBase64(s string) []byte { return []byte(base64.StdEncoding.EncodeToString([]byte(s))) }
