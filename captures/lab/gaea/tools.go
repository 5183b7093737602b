//go:build tools

package tools

import _ "github.com/XiaoMi/Gaea/cmd/gaea"
