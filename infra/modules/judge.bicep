// Optional: an Azure OpenAI account with one model deployment for the azure-ai-evaluation judges.
// Keys are disabled: the Function app calls it with its managed identity (Cognitive Services
// OpenAI User, granted below). A standard deployment bills per token and costs nothing at rest.

@description('Name of the account; also its custom subdomain, which Entra ID authentication needs.')
@minLength(2)
@maxLength(64)
param name string

@description('Azure region (the model and SKU must be offered there).')
param location string

@description('Tags for every resource.')
param tags object = {}

@description('Name of the model deployment (AGENT_LEARNING_JUDGE_DEPLOYMENT).')
param deploymentName string

@description('Model of the judge.')
param modelName string = 'gpt-4o-mini'

@description('Version of the model.')
param modelVersion string = '2024-07-18'

@description('Deployment type: GlobalStandard (pay per token, highest availability) or Standard.')
@allowed([
  'GlobalStandard'
  'Standard'
  'DataZoneStandard'
])
param deploymentSku string = 'GlobalStandard'

@description('Capacity in thousands of tokens per minute (main.bicep computes it: judged episodes a minute x tokens admitted per episode / 1000, rounded up).')
@minValue(1)
param capacity int = 36

@description('Principal id of the managed identity the Function app runs as.')
param functionPrincipalId string

@description('Principal id of the deploying user or pipeline (empty: no role for it).')
param userPrincipalId string = ''

@description('Type of userPrincipalId.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param userPrincipalType string = 'User'

// Cognitive Services OpenAI User: chat completions, nothing else.
var openAiUser = '5e0bd9bd-7b93-4f28-af87-19fc36ad61bd'

resource account 'Microsoft.CognitiveServices/accounts@2024-10-01' = {
  name: name
  location: location
  tags: tags
  kind: 'OpenAI'
  sku: {
    name: 'S0'
  }
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    // checkov:skip=CKV_AZURE_134: the Function app (Flex Consumption without a virtual network) calls the judge model over its public endpoint; keys are disabled, so every call needs an Entra ID token and the OpenAI User role
    customSubDomainName: name
    disableLocalAuth: true
    publicNetworkAccess: 'Enabled'
    restrictOutboundNetworkAccess: true
    allowedFqdnList: []
  }
}

resource deployment 'Microsoft.CognitiveServices/accounts/deployments@2024-10-01' = {
  parent: account
  name: deploymentName
  sku: {
    name: deploymentSku
    capacity: capacity
  }
  properties: {
    model: {
      format: 'OpenAI'
      name: modelName
      version: modelVersion
    }
    versionUpgradeOption: 'OnceNewDefaultVersionAvailable'
  }
}

resource functionOpenAiUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, functionPrincipalId, openAiUser)
  scope: account
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', openAiUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The deploying user: scoring locally with the same judge model.
resource userOpenAiUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(userPrincipalId)) {
  name: guid(account.id, userPrincipalId, openAiUser)
  scope: account
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', openAiUser)
    principalId: userPrincipalId
    principalType: userPrincipalType
  }
}

output name string = account.name
output id string = account.id
output endpoint string = account.properties.endpoint
output deploymentName string = deployment.name
